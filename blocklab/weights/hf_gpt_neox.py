"""GPT-NeoX's layout (``transformers.GPTNeoXForCausalLM``: Pythia) <-> blocklab's parallel rotary stack.

    embed_in                                   -> embed
    layers.{i}.input_layernorm                 -> blocks.{i}.ln1
    layers.{i}.post_attention_layernorm        -> blocks.{i}.ln2         (z = x + MHA(LN1(x)) + FFN(LN2(x)))
    layers.{i}.attention.query_key_value       -> blocks.{i}.attn.q, k, v   (head by head: [q_h k_h v_h])
    layers.{i}.attention.dense                 -> blocks.{i}.attn.o
    layers.{i}.mlp.dense_h_to_4h, dense_4h_to_h -> blocks.{i}.ffn.w1, w2
    final_layer_norm, embed_out                -> ln_f, head

``use_parallel_residual`` false gives the sequential pre-norm block. Rotary positions rotate the
first ``rotary_pct`` of each head (Pythia: 25%). ``GPTNeoXForCausalLM`` files prefix the stack with
``gpt_neox.``; ``GPTNeoXModel`` files do not. Both import; export writes the ``GPTNeoXForCausalLM``
layout.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig
from .hf_map import (
    PLAIN_BIASES,
    PLAIN_SCORES,
    PretrainedError,
    WeightMap,
    check_exportable,
    export_activation,
    hf_value,
    renamed,
    require,
)
from .hf_tokenizer import HFTokenizer

MODEL_TYPE = "gpt_neox"
name = "GPT-NeoX"  # for messages and the lists of families
default_prepend_bos = False  # as TransformerLens' GPT-NeoX (Pythia): text gets no BOS token
# Buffers older files carry (the causal mask, the rotary frequencies): recomputed, never read.
IGNORED = (r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",)

# transformers' GPTNeoXConfig defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50432, "max_position_embeddings": 2048, "hidden_size": 6144, "num_hidden_layers": 44,
    "num_attention_heads": 64, "intermediate_size": 24576, "hidden_act": "gelu", "rotary_pct": 0.25,
    "rotary_emb_base": 10000.0, "attention_dropout": 0.0, "hidden_dropout": 0.0, "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False, "use_parallel_residual": True, "attention_bias": True,
}
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "quick_gelu": "gelu_sigmoid"}
LAYER = {"input_layernorm": "ln1", "post_attention_layernorm": "ln2", "attention.dense": "attn.o",
         "mlp.dense_h_to_4h": "ffn.w1", "mlp.dense_4h_to_h": "ffn.w2"}
LAYOUTS = {True: "parallel", False: "pre"}  # use_parallel_residual -> norm_position
# The config fields the architecture fixes, besides the layout (import sets them, export checks them).
ARCHITECTURE = dict(
    norm="standard", residual="add", bias=True, causal=True, pos_encoding="rotary", rotary_style="half",
    embed_norm=False, final_norm=True, type_vocab_size=0, embed_scale="none", n_kv_heads=None,
    qkv_bias=None, sliding_window=None, rope_scaling=None, positions_from_mask=False, **PLAIN_BIASES,
    **PLAIN_SCORES)
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


# transformers 4.x reads rotary_pct and rotary_emb_base and sets the newer names from them
# (GPTNeoXConfig.__init__ overwrites a config.json's partial_rotary_factor and rope_theta): blocklab reads
# the same fields, and refuses a file whose newer name says otherwise (another reader would build
# another model from it).
RENAMED = {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"}


def _read_renamed(hf: dict[str, Any], name: str) -> float:
    """A field transformers 4.x reads under its older name; PretrainedError when the newer name disagrees."""
    value = hf_value(hf, DEFAULTS, name)
    newer = RENAMED[name]
    if hf.get(newer) is not None and hf_value(hf, {newer: DEFAULTS[name]}, newer) != value:
        read = f"{name}={value!r}" if hf.get(name) is not None else f"{name} (absent: {value!r}, the default)"
        raise PretrainedError(f"config.json {newer}={hf[newer]!r} disagrees with {read}: transformers 4.x "
                              f"reads {name} and ignores {newer}; set both to the value meant")
    return float(value)


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a GPT-NeoX config.json; every field blocklab cannot honour refused."""
    get = lambda name: hf_value(hf, DEFAULTS, name)
    act = require(hf, DEFAULTS, "hidden_act", tuple(ACTIVATIONS))
    require(hf, DEFAULTS, "attention_dropout", (0, 0.0))
    require(hf, DEFAULTS, "hidden_dropout", (0, 0.0))
    require(hf, DEFAULTS, "attention_bias", (True,))
    if hf.get("rope_scaling") is not None:
        raise PretrainedError(f"config.json rope_scaling={hf['rope_scaling']!r} is not supported for "
                              "GPT-NeoX (blocklab computes Llama 3's scaling only, for the Llama layout)")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=get("hidden_size"),
        n_heads=get("num_attention_heads"), n_layers=get("num_hidden_layers"), d_ff=get("intermediate_size"),
        activation=ACTIVATIONS[act], eps=float(get("layer_norm_eps")),
        tie_embeddings=get("tie_word_embeddings"),
        norm_position=LAYOUTS[require(hf, DEFAULTS, "use_parallel_residual", (True, False))],
        rotary_fraction=_read_renamed(hf, "rotary_pct"), rotary_base=_read_renamed(hf, "rotary_emb_base"),
        **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.GPTNeoXForCausalLM``."""
    layouts = {position: parallel for parallel, position in LAYOUTS.items()}
    if config.norm_position not in layouts:
        raise PretrainedError(f"this model has no GPT-NeoX layout: ModelConfig norm_position="
                              f"{config.norm_position!r} (needs 'parallel' or 'pre')")
    check_exportable(config, "GPT-NeoX", ARCHITECTURE)
    c = config
    eos = tokenizer.eos_id if tokenizer else None
    return {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.max_seq_len, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
        "hidden_act": export_activation(c, ACTIVATIONS), "rotary_pct": c.rotary_fraction,
        "partial_rotary_factor": c.rotary_fraction, "rotary_emb_base": c.rotary_base,
        "rope_theta": c.rotary_base,
        "attention_dropout": 0.0, "hidden_dropout": 0.0, "layer_norm_eps": c.eps, "initializer_range": 0.02,
        "tie_word_embeddings": c.tie_embeddings, "use_parallel_residual": layouts[c.norm_position],
        "attention_bias": True, "bos_token_id": eos, "eos_token_id": eos,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every GPTNeoXForCausalLM tensor (without the ``gpt_neox.`` prefix) and the blocklab tensors it is."""
    rows = [WeightMap("embed_in.weight", ("embed.weight",))]
    for i in range(config.n_layers):
        hf, us = f"layers.{i}.", f"blocks.{i}."
        rows += [WeightMap(f"{hf}attention.query_key_value.{p}", tuple(f"{us}attn.{n}.{p}" for n in "qkv"),
                           heads=config.n_heads) for p in ("weight", "bias")]
        rows += renamed(hf, us, LAYER)
    rows += renamed("", "", {"final_layer_norm": "ln_f"})
    if not config.tie_embeddings:
        rows.append(WeightMap("embed_out.weight", ("head.weight",)))
    return rows


def normalize_key(key: str) -> str:
    """GPTNeoXForCausalLM keys (``gpt_neox.`` prefix) -> GPTNeoXModel's."""
    return key.removeprefix("gpt_neox.")


def export_key(key: str) -> str:
    """GPTNeoXForCausalLM's keys: the stack under ``gpt_neox.``, the head beside it."""
    return key if key == "embed_out.weight" else f"gpt_neox.{key}"
