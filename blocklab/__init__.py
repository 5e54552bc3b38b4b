"""blocklab: the transformer block you can see, train, ablate and load real weights into.

The public API, re-exported (``import blocklab as bl``), each name imported on first use; nothing
else is defined here. The package, lowest layer first (each subpackage's ``__init__`` says what it
holds and what it may import; imports go down the layers only, tests/test_layers.py checks it):

    errors, version, device    what every layer may use
    files/                     atomic writes, strict JSON, the folders a command may claim
    nn/                        the model: config, layouts, components, block, stack, hooks, cache
    tasks/                     the toy tasks and their tokenizer
    inspect/                   the tracer, diagnostics, non-finite detection
    training/                  the loop, the run folder, checkpoints, train config and state
    weights/                   one loader for every model path; Hugging Face folders in and out
    lab/                       ablation grids and claims
    bench/                     the side-by-side benchmark
    cli/                       the ``blocklab`` command

May import: any.
"""

from importlib import import_module

# Each public name and the module that defines it. They are imported on first use (PEP 562), so that
# ``import blocklab`` costs nothing: the ``blocklab`` command takes Ctrl-C before torch loads
# (``__main__.run``), and its start-up interrupted is one line, not a traceback.
_EXPORTS = {
    "__version__": ".version",
    "ACTIVATION_NAMES": ".nn.activations",
    "ActivationCache": ".nn.cache",
    "count_parameters": ".nn.params",
    "detect_nonfinite": ".inspect.nonfinite",
    "estimate_memory": ".nn.memory",
    "FactoredMatrix": ".nn.factored",
    "FeedForward": ".nn.feedforward",
    "find_first_nonfinite": ".inspect.nonfinite",
    "get_activation": ".nn.activations",
    "HookPoint": ".nn.hooks",
    "hooks": ".nn.hooks",
    "IGNORE_INDEX": ".nn.model",
    "layer_norm_stats": ".nn.norms",
    "LayerNorm": ".nn.norms",
    "load": ".weights.load",
    "Loaded": ".weights.load",
    "ModelConfig": ".nn.config",
    "MultiHeadAttention": ".nn.attention",
    "NonFiniteError": ".inspect.nonfinite",
    "ParamCount": ".nn.params",
    "preset": ".nn.presets",
    "read_weights_file": ".weights.by_stage",
    "PRESETS": ".nn.presets",
    "Residual": ".nn.block",
    "run_with_cache": ".nn.cache",
    "set_weights_by_stage": ".weights.by_stage",
    "Transformer": ".nn.model",
    "TransformerBlock": ".nn.block",
    "TRANSFORMERLENS_ALIASES": ".nn.hook_names",
    "weights_by_stage": ".weights.by_stage",
    "write_weights_file": ".weights.by_stage",
}

__all__ = [
    "ACTIVATION_NAMES",
    "ActivationCache",
    "IGNORE_INDEX",
    "PRESETS",
    "TRANSFORMERLENS_ALIASES",
    "FactoredMatrix",
    "FeedForward",
    "HookPoint",
    "LayerNorm",
    "Loaded",
    "ModelConfig",
    "MultiHeadAttention",
    "NonFiniteError",
    "ParamCount",
    "Residual",
    "Transformer",
    "TransformerBlock",
    "count_parameters",
    "detect_nonfinite",
    "estimate_memory",
    "find_first_nonfinite",
    "get_activation",
    "hooks",
    "layer_norm_stats",
    "load",
    "preset",
    "read_weights_file",
    "run_with_cache",
    "set_weights_by_stage",
    "weights_by_stage",
    "write_weights_file",
    "__version__",
]


def __getattr__(name: str) -> object:  # (no typing import: it would lengthen start-up, see __main__)
    """``blocklab.NAME``: imported from its module on first use, then kept here."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'blocklab' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
