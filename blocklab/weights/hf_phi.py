"""Phi's layout (``transformers.PhiForCausalLM``: phi-1, phi-1.5, phi-2) <-> blocklab's parallel block with
one shared norm, partial rotary positions, biases everywhere and a biased head.

    model.embed_tokens                              -> embed
    model.layers.{i}.input_layernorm                -> blocks.{i}.ln1   (z = x + MHA(LN1(x)) + FFN(LN1(x)))
    model.layers.{i}.self_attn.{q,k,v}_proj, dense  -> blocks.{i}.attn.q, k, v, o
    model.layers.{i}.mlp.fc1, fc2                   -> blocks.{i}.ffn.w1, w2
    model.final_layernorm                           -> ln_f
    lm_head (weight and bias)                       -> head (a tied head keeps its bias)

Rotary positions rotate the first ``partial_rotary_factor`` of each head, pairs split in halves (GPT-NeoX's
way; phi-2: 0.4 of 80). One ``dropout`` serves the three of config.json (resid_pdrop, embd_pdrop,
attention_dropout): values that differ are refused. Refused by name as well: QK-norm (``qk_layernorm``,
per-head LayerNorms blocklab's head-wise QK-norm could hold but transformers sizes from hidden_size), rope
scaling, and activations blocklab does not have.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig
from .hf_map import (
    PLAIN_SCORES,
    PretrainedError,
    WeightMap,
    check_exportable,
    export_activation,
    head_rows,
    hf_value,
    renamed,
    require,
    same_dropouts,
)
from .hf_tokenizer import HFTokenizer

MODEL_TYPE = "phi"
name = "Phi"  # for messages and the lists of families
default_prepend_bos = False  # as TransformerLens' Phi (CodeGen's tokenizer: no BOS is added to text)
IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight")  # (when tied)

# transformers' PhiConfig defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 51200, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "attention_dropout": 0.0, "hidden_act": "gelu_new", "max_position_embeddings": 2048,
    "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
    "partial_rotary_factor": 0.5, "qk_layernorm": False,
}
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "quick_gelu": "gelu_sigmoid"}  # export: the first of each
DROPOUTS = ("resid_pdrop", "embd_pdrop", "attention_dropout")
LAYER = {"input_layernorm": "ln1", "self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k",
         "self_attn.v_proj": "attn.v", "self_attn.dense": "attn.o", "mlp.fc1": "ffn.w1", "mlp.fc2": "ffn.w2"}
# The config fields the architecture fixes (import sets them, export checks them).
ARCHITECTURE = dict(
    norm_position="parallel_shared", norm="standard", residual="add", bias=True, qkv_bias=None, o_bias=None,
    head_bias=True, causal=True, pos_encoding="rotary", rotary_style="half", rope_scaling=None,
    sliding_window=None, qk_norm="none", embed_norm=False, final_norm=True, type_vocab_size=0,
    embed_scale="none", positions_from_mask=False, head_dim=None,
    **PLAIN_SCORES)
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Phi config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    act = require(hf, DEFAULTS, "hidden_act", tuple(ACTIVATIONS))
    require(hf, DEFAULTS, "qk_layernorm", (False,))
    if hf.get("rope_scaling") is not None:
        raise PretrainedError(f"config.json rope_scaling={hf['rope_scaling']!r} is not supported for Phi "
                              "(blocklab computes Llama 3's scaling only, for the Llama layout)")
    heads = get("num_attention_heads")
    kv_heads = get("num_key_value_heads")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=get("hidden_size"),
        n_heads=heads, n_kv_heads=None if kv_heads in (None, heads) else kv_heads,
        n_layers=get("num_hidden_layers"), d_ff=get("intermediate_size"), activation=ACTIVATIONS[act],
        eps=float(get("layer_norm_eps")), tie_embeddings=get("tie_word_embeddings"),
        dropout=same_dropouts(hf, DEFAULTS, DROPOUTS),
        rotary_fraction=float(get("partial_rotary_factor")), rotary_base=float(get("rope_theta")),
        **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.PhiForCausalLM``."""
    check_exportable(config, name, ARCHITECTURE)
    c = config
    return {
        "architectures": ["PhiForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.kv_heads,
        **{field: c.dropout for field in DROPOUTS}, "hidden_act": export_activation(c, ACTIVATIONS),
        "max_position_embeddings": c.max_seq_len, "initializer_range": 0.02, "layer_norm_eps": c.eps,
        "tie_word_embeddings": c.tie_embeddings, "rope_theta": c.rotary_base, "rope_scaling": None,
        "partial_rotary_factor": c.rotary_fraction, "qk_layernorm": False,
        "bos_token_id": tokenizer.bos_id if tokenizer else None,
        "eos_token_id": tokenizer.eos_id if tokenizer else None,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every PhiForCausalLM tensor and the blocklab tensor it is."""
    rows = [WeightMap("model.embed_tokens.weight", ("embed.weight",))]
    for i in range(config.n_layers):
        rows += renamed(f"model.layers.{i}.", f"blocks.{i}.", LAYER)
    rows += renamed("model.", "", {"final_layernorm": "ln_f"})
    return rows + head_rows("lm_head", config)


def normalize_key(key: str) -> str:
    """The keys are the same in every file (PhiForCausalLM's)."""
    return key


def export_key(key: str) -> str:
    return key
