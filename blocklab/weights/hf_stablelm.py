"""StableLM's layout (``transformers.StableLmForCausalLM``: StableLM 2, StableLM-3B-4E1T) <-> blocklab's
rotary stack with biased LayerNorms, a bias-free SwiGLU and partial rotary positions.

    model.embed_tokens                                 -> embed
    model.layers.{i}.input_layernorm                   -> blocks.{i}.ln1      (LayerNorm: weight and bias)
    model.layers.{i}.self_attn.{q,k,v}_proj            -> blocks.{i}.attn.q, k, v   (biases: use_qkv_bias)
    model.layers.{i}.self_attn.o_proj                  -> blocks.{i}.attn.o         (no bias)
    model.layers.{i}.post_attention_layernorm          -> blocks.{i}.ln2      (absent with the parallel block)
    model.layers.{i}.mlp.gate_proj, up_proj, down_proj -> blocks.{i}.ffn.w1, w3, w2  (SwiGLU, no biases)
    model.norm, lm_head                                -> ln_f, head          (lm_head: tied or not)

Rotary positions rotate the first int(head_dim * ``partial_rotary_factor``) features of each head, pairs
split in halves (GPT-NeoX's way; StableLM 2: 0.25 of 64). ``use_parallel_residual`` makes the block
x + MHA(LN1(x)) + FFN(LN1(x)) with one norm (layout parallel_shared, as Phi's and GPT-J's); otherwise
pre-norm. Refused by name: ``qk_layernorm`` (a LayerNorm per head with each head's own weights, which
blocklab's QK-norm, one norm shared by every head, cannot hold), rope scaling, dropouts, an activation
other than silu.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig
from .hf_llama import LAYER as LLAMA_LAYER
from .hf_map import (
    PLAIN_SCORES,
    PretrainedError,
    WeightMap,
    check_exportable,
    hf_value,
    renamed,
    require,
)
from .hf_tokenizer import HFTokenizer

MODEL_TYPE = "stablelm"
name = "StableLM"  # for messages and the lists of families
default_prepend_bos = True  # TransformerLens' default (its StableLM bridge sets none of its own)
IGNORED = (r"lm_head\.weight",)  # (when tied)

# transformers' StableLmConfig defaults, for fields a config.json leaves out (StableLM-3B-4E1T's shape).
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50304, "intermediate_size": 6912, "hidden_size": 2560, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
    "use_qkv_bias": False, "qk_layernorm": False, "use_parallel_residual": False, "hidden_dropout": 0.0,
    "attention_dropout": 0.0, "partial_rotary_factor": 0.25,
}
NORMS = {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"}  # weights and biases
MATRICES = {hf: ours for hf, ours in LLAMA_LAYER.items() if hf not in NORMS}  # weights only
# The config fields the architecture fixes (import sets them, export checks them); the block's layout and
# the q/k/v biases are read.
ARCHITECTURE = dict(
    norm="standard", residual="add", bias=True, o_bias=False, ffn_bias=False, head_bias=False, causal=True,
    pos_encoding="rotary", rotary_style="half", rope_scaling=None, sliding_window=None, qk_norm="none",
    embed_norm=False, final_norm=True, type_vocab_size=0, embed_scale="none", positions_from_mask=False,
    head_dim=None, activation="swiglu", **PLAIN_SCORES)
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight
LAYOUTS = {True: "parallel_shared", False: "pre"}  # use_parallel_residual -> norm_position


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a StableLM config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    require(hf, DEFAULTS, "hidden_act", ("silu",))
    require(hf, DEFAULTS, "qk_layernorm", (False,))  # per-head weights: see the module's docstring
    for field in ("hidden_dropout", "attention_dropout"):
        require(hf, DEFAULTS, field, (0, 0.0))
    if hf.get("rope_scaling") is not None:
        raise PretrainedError(f"config.json rope_scaling={hf['rope_scaling']!r} is not supported for "
                              "StableLM (blocklab computes Llama 3's scaling only, for the Llama layout)")
    heads, kv_heads = get("num_attention_heads"), get("num_key_value_heads")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=get("hidden_size"),
        n_heads=heads, n_kv_heads=None if kv_heads in (None, heads) else kv_heads,
        n_layers=get("num_hidden_layers"), d_ff=get("intermediate_size"), eps=float(get("layer_norm_eps")),
        tie_embeddings=get("tie_word_embeddings"), qkv_bias=get("use_qkv_bias"),
        norm_position=LAYOUTS[get("use_parallel_residual")],
        rotary_fraction=float(get("partial_rotary_factor")), rotary_base=float(get("rope_theta")),
        **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.StableLmForCausalLM``."""
    check_exportable(config, name, ARCHITECTURE)
    c = config
    parallel = {layout: flag for flag, layout in LAYOUTS.items()}
    if c.norm_position not in parallel:
        raise PretrainedError(f"this model has no {name} layout: ModelConfig norm_position="
                              f"{c.norm_position!r} (needs {' or '.join(map(repr, parallel))})")
    return {
        "architectures": ["StableLmForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.kv_heads, "hidden_act": "silu",
        "max_position_embeddings": c.max_seq_len, "initializer_range": 0.02, "layer_norm_eps": c.eps,
        "tie_word_embeddings": c.tie_embeddings, "rope_theta": c.rotary_base, "rope_scaling": None,
        "use_qkv_bias": c.has_qkv_bias, "qk_layernorm": False,
        "use_parallel_residual": parallel[c.norm_position],
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "partial_rotary_factor": c.rotary_fraction,
        "bos_token_id": tokenizer.bos_id if tokenizer else None,
        "eos_token_id": tokenizer.eos_id if tokenizer else None,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every StableLmForCausalLM tensor and the blocklab tensor it is."""
    norms = {hf: ours for hf, ours in NORMS.items() if ours == "ln1" or config.norm_position == "pre"}
    rows = [WeightMap("model.embed_tokens.weight", ("embed.weight",))]
    for i in range(config.n_layers):
        hf, us = f"model.layers.{i}.", f"blocks.{i}."
        rows += renamed(hf, us, norms) + renamed(hf, us, MATRICES, params=("weight",))
        if config.has_qkv_bias:
            rows += renamed(hf, us, {f"self_attn.{n}_proj": f"attn.{n}" for n in "qkv"}, params=("bias",))
    rows += renamed("model.", "", {"norm": "ln_f"})
    if not config.tie_embeddings:
        rows.append(WeightMap("lm_head.weight", ("head.weight",)))
    return rows


def normalize_key(key: str) -> str:
    """The keys are the same in every file (StableLmForCausalLM's)."""
    return key


def export_key(key: str) -> str:
    return key
