"""GPT-2's layout (``transformers.GPT2LMHeadModel``) <-> blocklab's pre-norm causal stack.

    wte, wpe                         -> embed, pos
    h.{i}.ln_1, h.{i}.ln_2           -> blocks.{i}.ln1, ln2        (y = x + MHA(LN1(x)))
    h.{i}.attn.c_attn (q | k | v)    -> blocks.{i}.attn.q, k, v    (Conv1D: (in, out), transposed)
    h.{i}.attn.c_proj                -> blocks.{i}.attn.o          (Conv1D)
    h.{i}.mlp.c_fc, h.{i}.mlp.c_proj -> blocks.{i}.ffn.w1, w2      (Conv1D)
    ln_f, lm_head                    -> ln_f, head                  (lm_head tied to wte by default)

``GPT2LMHeadModel`` files prefix the stack with ``transformer.``; ``GPT2Model`` files do not.
Both import; export writes the ``GPT2LMHeadModel`` layout.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig
from .hf_map import (
    PLAIN_BIASES,
    PLAIN_SCORES,
    WeightMap,
    check_exportable,
    export_activation,
    hf_value,
    renamed,
    require,
)
from .hf_tokenizer import HFTokenizer

MODEL_TYPE = "gpt2"
name = "GPT-2"  # for messages and the lists of families
default_prepend_bos = True  # as TransformerLens: text gets the BOS token first (where it has one)
# The causal-mask buffers older files carry, and a tied lm_head (read from wte instead).
IGNORED = (r"h\.\d+\.attn\.(bias|masked_bias)", r"lm_head\.weight")

# transformers' GPT2Config defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
    "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True,
    "add_cross_attention": False,
}
# Hugging Face activation name -> blocklab's; export uses the first name listed for each.
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "quick_gelu": "gelu_sigmoid"}

LAYER_NORMS = {"ln_1": "ln1", "ln_2": "ln2"}
LAYER_CONV1D = {"attn.c_proj": "attn.o", "mlp.c_fc": "ffn.w1", "mlp.c_proj": "ffn.w2"}

# The config fields GPT-2's architecture fixes (import sets them, export checks them).
ARCHITECTURE = dict(
    norm_position="pre", norm="standard", residual="add", bias=True, causal=True,
    pos_encoding="learned", embed_norm=False, final_norm=True, type_vocab_size=0,
    embed_scale="none", positions_from_mask=False,  # x0 = wte[t] + wpe[p]: no factor on the token rows
    **PLAIN_BIASES, **PLAIN_SCORES)
# How transformers initialises GPT2Model's tables (initializer_range): imported configs say so.
INIT = dict(embed_std=0.02, init="default")


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a GPT-2 config.json."""
    get = lambda name: hf_value(hf, DEFAULTS, name)
    require(hf, DEFAULTS, "scale_attn_weights", (True,))
    require(hf, DEFAULTS, "scale_attn_by_inverse_layer_idx", (False,))
    require(hf, DEFAULTS, "add_cross_attention", (False,))
    act = require(hf, DEFAULTS, "activation_function", tuple(ACTIVATIONS))
    d_model = get("n_embd")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("n_positions"), d_model=d_model, n_heads=get("n_head"),
        n_layers=get("n_layer"), d_ff=get("n_inner") or 4 * d_model, activation=ACTIVATIONS[act],
        eps=float(get("layer_norm_epsilon")), dropout=float(get("resid_pdrop")),
        tie_embeddings=get("tie_word_embeddings"), **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.GPT2LMHeadModel``."""
    check_exportable(config, "GPT-2", ARCHITECTURE)
    c = config
    eos = tokenizer.eos_id if tokenizer else None
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size, "n_positions": c.max_seq_len, "n_embd": c.d_model, "n_layer": c.n_layers,
        "n_head": c.n_heads, "n_inner": c.d_ff, "activation_function": export_activation(c, ACTIVATIONS),
        "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
        "layer_norm_epsilon": c.eps, "initializer_range": 0.02, "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": eos, "eos_token_id": eos,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every GPT2LMHeadModel tensor (without the ``transformer.`` prefix) and the blocklab tensors it is."""
    rows = renamed("", "", {"wte": "embed", "wpe": "pos"}, params=("weight",))
    for i in range(config.n_layers):
        hf, us = f"h.{i}.", f"blocks.{i}."
        rows += renamed(hf, us, LAYER_NORMS)
        rows += [WeightMap(f"{hf}attn.c_attn.{p}", tuple(f"{us}attn.{n}.{p}" for n in "qkv"), conv1d=True)
                 for p in ("weight", "bias")]
        rows += renamed(hf, us, LAYER_CONV1D, conv1d=True)
    rows += renamed("", "", {"ln_f": "ln_f"})
    if not config.tie_embeddings:
        rows.append(WeightMap("lm_head.weight", ("head.weight",)))
    return rows


def normalize_key(key: str) -> str:
    """GPT2LMHeadModel keys (``transformer.`` prefix) -> GPT2Model's."""
    return key.removeprefix("transformer.")


def export_key(key: str) -> str:
    """GPT2LMHeadModel's keys: the stack under ``transformer.``, the head beside it."""
    return key if key == "lm_head.weight" else f"transformer.{key}"
