"""GPT-Neo's layout (``transformers.GPTNeoForCausalLM``) <-> blocklab's pre-norm causal stack with learned
positions, unscaled scores and alternating global and local (windowed) attention.

    transformer.wte, wpe                                -> embed, pos
    transformer.h.{i}.ln_1, ln_2                        -> blocks.{i}.ln1, ln2   (y = x + MHA(LN1(x)))
    transformer.h.{i}.attn.attention.{q,k,v}_proj       -> blocks.{i}.attn.q, k, v   (no biases)
    transformer.h.{i}.attn.attention.out_proj           -> blocks.{i}.attn.o         (a bias)
    transformer.h.{i}.mlp.c_fc, c_proj                  -> blocks.{i}.ffn.w1, w2     (nn.Linear, biases)
    transformer.ln_f, lm_head                           -> ln_f, head                (lm_head tied to wte)

GPT-Neo's scores are q k^T, not divided by sqrt(d_k) (GPTNeoSelfAttention._attn): ``query_pre_attn_scalar``
1 (scores times 1^-1/2). Each layer's kind comes from ``attention_types`` ([[["global", "local"], 12]]
expands to global, local, global, ... over 24 layers): a local layer's query at i sees keys j with
i - window_size < j <= i (its mask is the causal one minus tril(-window_size)) -> layer_windows; a global
layer sees every earlier key. One ``dropout`` serves resid_dropout, embed_dropout and attention_dropout
(values that differ are refused). Refused by name as well: a layer kind other than global and local,
attention_types that do not expand to num_layers kinds, an ``attention_layers`` (transformers' expansion,
saved beside it, and what its model reads) that disagrees, an activation blocklab does not have.

transformers computes GPT-Neo's scores and softmax in float32 whatever the model's dtype; blocklab computes
them in the model's: the same in float32 (and better in float64), not the same numbers in bfloat16.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig
from .hf_gpt2 import ACTIVATIONS, export_key, normalize_key  # GPT-2's keys: the stack under transformer.
from .hf_map import (
    PLAIN_BIASES,
    PLAIN_SCORES,
    PretrainedError,
    WeightMap,
    check_exportable,
    export_activation,
    hf_value,
    one_window_layer_types,
    renamed,
    require,
    same_dropouts,
    window_fields,
)
from .hf_tokenizer import HFTokenizer

__all__ = ["config_from_hf", "export_key", "hf_config", "layer_kinds", "normalize_key", "weight_map"]

MODEL_TYPE = "gpt_neo"
name = "GPT-Neo"  # for messages and the lists of families
default_prepend_bos = True  # as TransformerLens' GPT-Neo (its default)
# The causal-mask buffers of older files (transformers keeps them out of the state dict now) and a tied head.
IGNORED = (r"h\.\d+\.attn\.attention\.(bias|masked_bias)", r"lm_head\.weight")

# transformers' GPTNeoConfig defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "max_position_embeddings": 2048, "hidden_size": 2048, "num_layers": 24,
    "attention_types": [[["global", "local"], 12]], "num_heads": 16, "intermediate_size": None,
    "window_size": 256, "activation_function": "gelu_new", "resid_dropout": 0.0, "embed_dropout": 0.0,
    "attention_dropout": 0.0, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
}
DROPOUTS = ("resid_dropout", "embed_dropout", "attention_dropout")
KINDS = {"full_attention": "global", "sliding_attention": "local"}  # transformers' later words -> GPT-Neo's
ATTENTION = {f"attn.attention.{n}_proj": f"attn.{n}" for n in "qkv"}  # weights only
LAYER = {"ln_1": "ln1", "ln_2": "ln2", "attn.attention.out_proj": "attn.o", "mlp.c_fc": "ffn.w1",
         "mlp.c_proj": "ffn.w2"}  # weights and biases
# The config fields the architecture fixes (import sets them, export checks them); the windows are read.
ARCHITECTURE = dict(
    norm_position="pre", norm="standard", residual="add", bias=True, qkv_bias=False, causal=True,
    pos_encoding="learned", embed_norm=False, final_norm=True, type_vocab_size=0, embed_scale="none",
    positions_from_mask=False, n_kv_heads=None, head_dim=None, qk_norm="none",
    **PLAIN_BIASES, **{k: v for k, v in PLAIN_SCORES.items() if k != "layer_windows"})
ARCHITECTURE["query_pre_attn_scalar"] = 1.0  # scores q k^T: times 1^-1/2
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


def layer_kinds(attention_types: Any, n_layers: Any) -> list[str]:
    """GPTNeoConfig.expand_attention_types_params: each [kinds, n] repeats kinds n times; the result must
    name global or local for each of the n_layers layers (refused by name otherwise)."""
    kinds: list[Any] = []
    try:
        for pattern, repeat in attention_types:
            kinds += list(pattern) * repeat
    except (TypeError, ValueError):
        kinds = [None]
    if len(kinds) != n_layers or any(kind not in KINDS.values() for kind in kinds):
        raise PretrainedError(f"config.json attention_types={attention_types!r} must expand to global or "
                              f"local for each of the {n_layers} layers (num_layers)")
    return kinds


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a GPT-Neo config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    act = require(hf, DEFAULTS, "activation_function", tuple(ACTIVATIONS))
    d_model, n_layers = get("hidden_size"), get("num_layers")
    kinds = layer_kinds(hf.get("attention_types", DEFAULTS["attention_types"]), n_layers)
    if hf.get("attention_layers", kinds) != kinds:  # transformers' own expansion, saved beside it
        raise PretrainedError(f"config.json attention_layers={hf['attention_layers']!r} disagrees with "
                              f"attention_types={hf.get('attention_types')!r} (which expands to {kinds}): "
                              "transformers builds the layers attention_layers names")
    window = get("window_size")
    windows = tuple(window if kind == "local" else None for kind in kinds) if "local" in kinds else None
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=d_model,
        n_heads=get("num_heads"), n_layers=n_layers, d_ff=get("intermediate_size") or 4 * d_model,
        activation=ACTIVATIONS[act], eps=float(get("layer_norm_epsilon")),
        tie_embeddings=get("tie_word_embeddings"), dropout=same_dropouts(hf, DEFAULTS, DROPOUTS),
        **window_fields(windows), **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.GPTNeoForCausalLM``: attention_types as the shortest pattern that
    repeats to every layer's kind; windows of two sizes refused (GPT-Neo has one window_size)."""
    check_exportable(config, name, ARCHITECTURE)
    c = config
    kinds, window = one_window_layer_types(c, name)
    neo = [KINDS[kind] for kind in kinds]
    period = next(p for p in range(1, c.n_layers + 1) if neo == neo[:p] * (c.n_layers // p))
    eos = tokenizer.eos_id if tokenizer else None
    return {
        "architectures": ["GPTNeoForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_seq_len, "hidden_size": c.d_model, "num_layers": c.n_layers,
        "num_heads": c.n_heads, "intermediate_size": c.d_ff,
        "attention_types": [[neo[:period], c.n_layers // period]], "attention_layers": neo,
        "window_size": DEFAULTS["window_size"] if window is None else window,  # unused without a local layer
        "activation_function": export_activation(c, ACTIVATIONS), **{field: c.dropout for field in DROPOUTS},
        "layer_norm_epsilon": c.eps, "initializer_range": 0.02, "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": tokenizer.bos_id if tokenizer else eos, "eos_token_id": eos,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every GPTNeoForCausalLM tensor (without the ``transformer.`` prefix) and the blocklab tensor it is."""
    rows = renamed("", "", {"wte": "embed", "wpe": "pos"}, params=("weight",))
    for i in range(config.n_layers):
        hf, us = f"h.{i}.", f"blocks.{i}."
        rows += renamed(hf, us, ATTENTION, params=("weight",)) + renamed(hf, us, LAYER)
    rows += renamed("", "", {"ln_f": "ln_f"})
    if not config.tie_embeddings:
        rows.append(WeightMap("lm_head.weight", ("head.weight",)))
    return rows
