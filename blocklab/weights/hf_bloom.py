"""BLOOM's layout (``transformers.BloomForCausalLM``: bloom-560m ... bloom) <-> blocklab's pre-norm block with
ALiBi positions, a LayerNorm on the embeddings, GELU (tanh) and biases everywhere.

    word_embeddings                              -> embed
    word_embeddings_layernorm                    -> embed_ln         (x0 = LN(E[t]): embed_norm)
    h.{i}.input_layernorm                        -> blocks.{i}.ln1
    h.{i}.self_attention.query_key_value         -> blocks.{i}.attn.q, k, v  (head by head: [q_h k_h v_h],
                                                    BloomAttention._reshape's (heads, 3, d_head) view)
    h.{i}.self_attention.dense                   -> blocks.{i}.attn.o
    h.{i}.post_attention_layernorm               -> blocks.{i}.ln2
    h.{i}.mlp.dense_h_to_4h, dense_4h_to_h       -> blocks.{i}.ffn.w1, w2  (d_ff = 4 hidden_size, always)
    ln_f, lm_head                                -> ln_f, head       (lm_head: tied unless tie_word_embeddings
                                                                      is false)

ALiBi's slopes are the paper's for any head count (blocklab/nn/alibi.py; transformers' build_alibi_tensor
computes the same numbers in float32, a few ulp apart from 11 heads on). transformers adds m_h j where
blocklab adds -m_h (i - j): the same softmax. BLOOM has no position table, so nothing in config.json bounds
the length: blocklab's max_seq_len is ``seq_length`` where a file has it, else 2048 (BLOOM's training
length), and export writes it there. ``BloomForCausalLM`` files prefix the stack with ``transformer.``; the
released checkpoints (saved from ``BloomModel``) do not. Both import. Refused by name:
``apply_residual_connection_post_layernorm`` (the residual taken after the norm), ``slow_but_exact`` with
``pretraining_tp`` > 1 (sums split in tp slices), dropouts.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig

# GPT-2's keys, the same rule: the stack under ``transformer.``, lm_head beside it
from .hf_gpt2 import export_key as export_key
from .hf_gpt2 import normalize_key as normalize_key
from .hf_map import (
    PLAIN_BIASES,
    PLAIN_SCORES,
    PretrainedError,
    WeightMap,
    check_exportable,
    hf_value,
    renamed,
    require,
)
from .hf_tokenizer import HFTokenizer

MODEL_TYPE = "bloom"
name = "BLOOM"  # for messages and the lists of families
default_prepend_bos = False  # as TransformerLens' BLOOM
IGNORED = (r"lm_head\.weight",)  # (when tied)

# transformers' BloomConfig defaults, for fields a config.json leaves out; num_attention_heads and
# num_hidden_layers are its other names for n_head and n_layer, n_embed an older one for hidden_size.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 8, "layer_norm_epsilon": 1e-5,
    "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    "pretraining_tp": 1, "slow_but_exact": False, "tie_word_embeddings": True, "seq_length": 2048,
}
ALIASES = {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads", "hidden_size": "n_embed"}
LAYER = {"input_layernorm": "ln1", "self_attention.dense": "attn.o", "post_attention_layernorm": "ln2",
         "mlp.dense_h_to_4h": "ffn.w1", "mlp.dense_4h_to_h": "ffn.w2"}
# The config fields the architecture fixes (import sets them, export checks them).
ARCHITECTURE = dict(
    norm_position="pre", norm="standard", residual="add", bias=True, causal=True, pos_encoding="alibi",
    activation="gelu_tanh", embed_norm=True, final_norm=True, type_vocab_size=0, embed_scale="none",
    n_kv_heads=None, qkv_bias=None, head_dim=None, sliding_window=None, qk_norm="none", rope_scaling=None,
    positions_from_mask=False, n_experts=0, **PLAIN_BIASES, **PLAIN_SCORES)
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


def _aliased(hf: dict[str, Any], field: str) -> Any:
    """A field BloomConfig also takes under another name (``ALIASES``); the two disagreeing is refused."""
    other = ALIASES[field]
    if hf.get(other) is None:
        return hf_value(hf, DEFAULTS, field)
    value = hf_value(hf, {other: DEFAULTS[field]}, other)
    if hf.get(field) is not None and hf_value(hf, DEFAULTS, field) != value:
        raise PretrainedError(f"config.json {field}={hf[field]!r} disagrees with {other}={value!r}; "
                              "BloomConfig reads one of them: set both to the value meant")
    return value


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a BLOOM config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    require(hf, DEFAULTS, "apply_residual_connection_post_layernorm", (False,))
    for field in ("hidden_dropout", "attention_dropout"):
        require(hf, DEFAULTS, field, (0, 0.0))
    if get("pretraining_tp") > 1:  # (with tp 1 the flag changes nothing)
        require(hf, DEFAULTS, "slow_but_exact", (False,))
    d_model = _aliased(hf, "hidden_size")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("seq_length"), d_model=d_model,
        n_heads=_aliased(hf, "n_head"), n_layers=_aliased(hf, "n_layer"),
        d_ff=4 * d_model if isinstance(d_model, int) else d_model, eps=float(get("layer_norm_epsilon")),
        tie_embeddings=get("tie_word_embeddings"), **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.BloomForCausalLM``."""
    check_exportable(config, name, {**ARCHITECTURE, "d_ff": 4 * config.d_model})
    c = config
    return {
        "architectures": ["BloomForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads, "layer_norm_epsilon": c.eps,
        "initializer_range": 0.02, "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0,
        "attention_dropout": 0.0, "pretraining_tp": 1, "slow_but_exact": False,
        "tie_word_embeddings": c.tie_embeddings, "seq_length": c.max_seq_len,
        "bos_token_id": tokenizer.bos_id if tokenizer else None,
        "eos_token_id": tokenizer.eos_id if tokenizer else None,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every BloomForCausalLM tensor (without the ``transformer.`` prefix) and the blocklab tensors it is."""
    rows = [WeightMap("word_embeddings.weight", ("embed.weight",))]
    rows += renamed("", "", {"word_embeddings_layernorm": "embed_ln"})
    for i in range(config.n_layers):
        hf, us = f"h.{i}.", f"blocks.{i}."
        rows += [WeightMap(f"{hf}self_attention.query_key_value.{p}",
                           tuple(f"{us}attn.{n}.{p}" for n in "qkv"), heads=config.n_heads)
                 for p in ("weight", "bias")]
        rows += renamed(hf, us, LAYER)
    rows += renamed("", "", {"ln_f": "ln_f"})
    if not config.tie_embeddings:
        rows.append(WeightMap("lm_head.weight", ("head.weight",)))
    return rows

