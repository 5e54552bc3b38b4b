"""blocklab: the transformer block you can see, train, ablate and load real weights into.

The public API, re-exported (``import blocklab as bl``); nothing is defined here. The package, lowest
layer first (each subpackage's ``__init__`` says what it holds and what it may import; imports go
down the layers only, tests/test_layers.py checks it):

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

from .inspect.nonfinite import NonFiniteError, detect_nonfinite, find_first_nonfinite
from .nn.activations import ACTIVATION_NAMES, get_activation
from .nn.attention import MultiHeadAttention
from .nn.block import Residual, TransformerBlock
from .nn.cache import ActivationCache, run_with_cache
from .nn.config import PRESETS, ModelConfig, preset
from .nn.feedforward import FeedForward
from .nn.hooks import TRANSFORMERLENS_ALIASES, HookPoint, hooks
from .nn.memory import estimate_memory
from .nn.model import IGNORE_INDEX, Transformer
from .nn.norms import LayerNorm, layer_norm_stats
from .nn.params import ParamCount, count_parameters
from .version import __version__
from .weights.load import Loaded, load

__all__ = [
    "ACTIVATION_NAMES",
    "ActivationCache",
    "IGNORE_INDEX",
    "PRESETS",
    "TRANSFORMERLENS_ALIASES",
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
    "run_with_cache",
    "__version__",
]
