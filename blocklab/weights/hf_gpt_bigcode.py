"""GPT-BigCode's layout (``transformers.GPTBigCodeForCausalLM``: StarCoder, SantaCoder) <-> blocklab's
pre-norm causal stack with learned positions and multi-query attention: GPT-2's block with one key/value
head shared by every query head, in nn.Linear layers.

    transformer.wte, wpe                     -> embed, pos
    transformer.h.{i}.ln_1, ln_2             -> blocks.{i}.ln1, ln2       (y = x + MHA(LN1(x)))
    transformer.h.{i}.attn.c_attn            -> blocks.{i}.attn.q, k, v   (see below)
    transformer.h.{i}.attn.c_proj            -> blocks.{i}.attn.o
    transformer.h.{i}.mlp.c_fc, c_proj       -> blocks.{i}.ffn.w1, w2
    transformer.ln_f, lm_head                -> ln_f, head                (lm_head tied to wte)

``multi_query`` true (the default): c_attn's rows are q | k | v, q d_model wide, k and v one head
(head_dim) each -> n_kv_heads 1. ``multi_query`` false: c_attn's output is read as (heads, 3 head_dim), so
its rows are q, k, v interleaved head by head (GPT-NeoX's order) -> every head its own key and value.
``scale_attn_weights`` false leaves the scores unscaled (query_pre_attn_scalar 1). One ``dropout`` serves
resid_pdrop, embd_pdrop and attn_pdrop (values that differ are refused). Refused by name as well:
cross-attention (``add_cross_attention``), an activation blocklab does not have. transformers runs the
softmax in float32 whatever the dtype (``attention_softmax_in_fp32`` changes nothing in its eager or SDPA
attention); blocklab in the model's: the same in float32, not the same numbers in bfloat16.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig
from .hf_gpt2 import ACTIVATIONS as GPT2_ACTIVATIONS
from .hf_gpt2 import export_key, normalize_key  # GPT-2's keys: the stack under transformer.
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
    same_dropouts,
)
from .hf_tokenizer import HFTokenizer

__all__ = ["config_from_hf", "export_key", "hf_config", "normalize_key", "weight_map"]

MODEL_TYPE = "gpt_bigcode"
name = "GPT-BigCode"  # for messages and the lists of families
default_prepend_bos = True  # TransformerLens' default (its santacoder config sets none of its own)
IGNORED = (r"h\.\d+\.attn\.(bias|masked_bias)", r"lm_head\.weight")  # older files' mask buffers; a tied head

# transformers' GPTBigCodeConfig defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_pytorch_tanh", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "multi_query": True, "add_cross_attention": False,
    "tie_word_embeddings": True,
}
DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", **GPT2_ACTIVATIONS}  # export: its default name first
LAYER = {"ln_1": "ln1", "ln_2": "ln2", "attn.c_proj": "attn.o", "mlp.c_fc": "ffn.w1", "mlp.c_proj": "ffn.w2"}
# The config fields the architecture fixes (import sets them, export checks them); the key/value heads
# and the scores' scale are read.
ARCHITECTURE = dict(
    norm_position="pre", norm="standard", residual="add", bias=True, causal=True, pos_encoding="learned",
    embed_norm=False, final_norm=True, type_vocab_size=0, embed_scale="none", positions_from_mask=False,
    head_dim=None, qk_norm="none", sliding_window=None,
    **PLAIN_BIASES, **{k: v for k, v in PLAIN_SCORES.items() if k != "query_pre_attn_scalar"})
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a GPT-BigCode config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    require(hf, DEFAULTS, "add_cross_attention", (False,))
    act = require(hf, DEFAULTS, "activation_function", tuple(ACTIVATIONS))
    d_model = get("n_embd")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("n_positions"), d_model=d_model, n_heads=get("n_head"),
        n_kv_heads=1 if get("multi_query") else None, n_layers=get("n_layer"),
        d_ff=get("n_inner") or 4 * d_model, activation=ACTIVATIONS[act], eps=float(get("layer_norm_epsilon")),
        tie_embeddings=get("tie_word_embeddings"), dropout=same_dropouts(hf, DEFAULTS, DROPOUTS),
        query_pre_attn_scalar=None if get("scale_attn_weights") else 1.0, **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.GPTBigCodeForCausalLM``: one key/value head (multi_query) or one per
    query head; scores scaled by 1/sqrt(d_head) or not at all."""
    check_exportable(config, name, ARCHITECTURE)
    c = config
    if c.kv_heads not in (1, c.n_heads):
        raise PretrainedError(f"this model has no {name} layout: ModelConfig n_kv_heads={c.n_kv_heads!r} "
                              f"(needs 1, multi_query, or {c.n_heads}, one per query head)")
    if c.query_pre_attn_scalar not in (None, 1.0):
        raise PretrainedError(f"this model has no {name} layout: ModelConfig query_pre_attn_scalar="
                              f"{c.query_pre_attn_scalar!r} (needs None: scale_attn_weights, or 1.0: "
                              "unscaled)")
    eos = tokenizer.eos_id if tokenizer else None
    return {
        "architectures": ["GPTBigCodeForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "n_positions": c.max_seq_len, "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads,
        "n_inner": c.d_ff, "multi_query": c.n_kv_heads == 1,
        "activation_function": export_activation(c, ACTIVATIONS), **{field: c.dropout for field in DROPOUTS},
        "scale_attn_weights": c.query_pre_attn_scalar is None, "layer_norm_epsilon": c.eps,
        "initializer_range": 0.02, "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": tokenizer.bos_id if tokenizer else eos, "eos_token_id": eos,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every GPTBigCodeForCausalLM tensor (without the ``transformer.`` prefix) and the blocklab tensors it
    is: c_attn q | k | v with one key/value head, else interleaved head by head."""
    rows = renamed("", "", {"wte": "embed", "wpe": "pos"}, params=("weight",))
    heads = 0 if config.kv_heads == 1 else config.n_heads  # (one head of each alone is the same either way)
    for i in range(config.n_layers):
        hf, us = f"h.{i}.", f"blocks.{i}."
        rows += [WeightMap(f"{hf}attn.c_attn.{p}", tuple(f"{us}attn.{n}.{p}" for n in "qkv"), heads=heads)
                 for p in ("weight", "bias")]
        rows += renamed(hf, us, LAYER)
    rows += renamed("", "", {"ln_f": "ln_f"})
    if not config.tie_embeddings:
        rows.append(WeightMap("lm_head.weight", ("head.weight",)))
    return rows
