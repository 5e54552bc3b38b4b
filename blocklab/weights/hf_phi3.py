"""Phi-3's layout (``transformers.Phi3ForCausalLM``: Phi-3-mini, Phi-3-medium, Phi-3.5-mini) <-> blocklab's
Llama block: pre-norm RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases. Phi-3 fuses
two pairs of projections into one matrix each, split on import and fused again on export:

    model.embed_tokens                         -> embed
    model.layers.{i}.input_layernorm           -> blocks.{i}.ln1
    model.layers.{i}.self_attn.qkv_proj        -> blocks.{i}.attn.q, k, v  (rows: q | k | v, n_heads d_head
                                                  then n_kv_heads d_head twice)
    model.layers.{i}.self_attn.o_proj          -> blocks.{i}.attn.o
    model.layers.{i}.post_attention_layernorm  -> blocks.{i}.ln2
    model.layers.{i}.mlp.gate_up_proj          -> blocks.{i}.ffn.w1, w3    (rows: gate | up, d_ff each)
    model.layers.{i}.mlp.down_proj             -> blocks.{i}.ffn.w2        (silu(W1 x) * W3 x)
    model.norm, lm_head                        -> ln_f, head               (lm_head: tied or not)

Rotary positions rotate the first int(d_head * ``partial_rotary_factor``) features of each head, pairs split
in halves; ``sliding_window`` (Phi-3-mini-4k: 2047) limits every layer's attention. The model is Llama's (or
Mistral's, with a window) number for number, so export picks Llama or Mistral unless asked for ``phi3``.
Refused by name: ``rope_scaling`` (Phi-3's longrope, once called su or yarn, rescales the rotary frequencies
by per-feature factors that blocklab does not compute), a ``head_dim`` other than hidden_size / heads,
non-zero dropouts and an activation other than silu.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig
from .hf_llama import ARCHITECTURE as LLAMA_ARCHITECTURE
from .hf_map import PretrainedError, WeightMap, check_exportable, hf_value, renamed, require
from .hf_tokenizer import HFTokenizer

MODEL_TYPE = "phi3"
name = "Phi-3"  # for messages and the lists of families
default_prepend_bos = True  # as TransformerLens (the Llama tokenizer adds its own BOS)
IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight")  # (when tied)

# transformers' Phi3Config defaults, for fields a config.json leaves out (Phi-3-mini's shape).
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "attention_dropout": 0.0, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None, "partial_rotary_factor": 1.0,
    "sliding_window": None, "head_dim": None,
}
DROPOUTS = ("resid_pdrop", "embd_pdrop", "attention_dropout")
NORMS = {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"}
# The config fields the architecture fixes (import sets them, export checks them): Llama's block with no
# q/k/v biases, one width per head and no other rope; the window and the rotary fraction are read.
ARCHITECTURE = {**LLAMA_ARCHITECTURE, "activation": "swiglu", "qkv_bias": None, "head_dim": None,
                "rope_scaling": None, "n_experts": 0}
ARCHITECTURE.pop("rotary_fraction")
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Phi-3 config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    require(hf, DEFAULTS, "hidden_act", ("silu",))
    for field in DROPOUTS:
        require(hf, DEFAULTS, field, (0, 0.0))
    if hf.get("rope_scaling") is not None:
        raise PretrainedError(f"config.json rope_scaling={hf['rope_scaling']!r} is not supported for Phi-3 "
                              "(its longrope factors per rotary feature are not computed by blocklab; "
                              "supported: null)")
    d_model, heads, kv_heads = get("hidden_size"), get("num_attention_heads"), get("num_key_value_heads")
    head_dim = get("head_dim")
    if head_dim is not None and head_dim * heads != d_model:
        raise PretrainedError(f"config.json head_dim={head_dim!r} is not supported for Phi-3: blocklab reads "
                              f"heads of hidden_size / num_attention_heads = {d_model // heads} only")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=d_model,
        n_heads=heads, n_kv_heads=None if kv_heads in (None, heads) else kv_heads,
        n_layers=get("num_hidden_layers"), d_ff=get("intermediate_size"), eps=float(get("rms_norm_eps")),
        tie_embeddings=get("tie_word_embeddings"), rotary_base=float(get("rope_theta")),
        rotary_fraction=float(get("partial_rotary_factor")), sliding_window=get("sliding_window"),
        **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.Phi3ForCausalLM``."""
    check_exportable(config, name, ARCHITECTURE)
    c = config
    return {
        "architectures": ["Phi3ForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.kv_heads, "hidden_act": "silu",
        **{field: 0.0 for field in DROPOUTS}, "max_position_embeddings": c.max_seq_len,
        "original_max_position_embeddings": c.max_seq_len, "initializer_range": 0.02,
        "rms_norm_eps": c.eps, "tie_word_embeddings": c.tie_embeddings, "rope_theta": c.rotary_base,
        "rope_scaling": None, "partial_rotary_factor": c.rotary_fraction, "sliding_window": c.sliding_window,
        "bos_token_id": tokenizer.bos_id if tokenizer else None,
        "eos_token_id": tokenizer.eos_id if tokenizer else None,
        "pad_token_id": None,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every Phi3ForCausalLM tensor and the blocklab tensors it is (the fused ones: rows concatenated)."""
    rows = [WeightMap("model.embed_tokens.weight", ("embed.weight",))]
    for i in range(config.n_layers):
        hf, us = f"model.layers.{i}.", f"blocks.{i}."
        rows += renamed(hf, us, {**NORMS, "self_attn.o_proj": "attn.o", "mlp.down_proj": "ffn.w2"},
                        params=("weight",))
        rows.append(WeightMap(f"{hf}self_attn.qkv_proj.weight", tuple(f"{us}attn.{p}.weight" for p in "qkv")))
        rows.append(WeightMap(f"{hf}mlp.gate_up_proj.weight", (f"{us}ffn.w1.weight", f"{us}ffn.w3.weight")))
    rows.append(WeightMap("model.norm.weight", ("ln_f.weight",)))
    if not config.tie_embeddings:
        rows.append(WeightMap("lm_head.weight", ("head.weight",)))
    return rows


def normalize_key(key: str) -> str:
    """The keys are the same in every file (Phi3ForCausalLM's)."""
    return key


def export_key(key: str) -> str:
    return key
