"""GPT-J's layout (``transformers.GPTJForCausalLM``) <-> blocklab's parallel block with one shared norm,
interleaved partial rotary positions, bias-free attention and a biased head.

    transformer.wte                                 -> embed
    transformer.h.{i}.ln_1                          -> blocks.{i}.ln1   (z = x + MHA(LN1(x)) + FFN(LN1(x)))
    transformer.h.{i}.attn.{q,k,v,out}_proj         -> blocks.{i}.attn.q, k, v, o   (no biases)
    transformer.h.{i}.mlp.fc_in, fc_out             -> blocks.{i}.ffn.w1, w2        (biases)
    transformer.ln_f                                -> ln_f
    lm_head (weight and bias)                       -> head

Rotary positions rotate the first ``rotary_dim`` features of each head as adjacent pairs (rotary_style
"interleaved"; GPT-J 6B: 64 of 256), with transformers' fixed base 10000. One ``dropout`` serves the three of
config.json (resid_pdrop, embd_pdrop, attn_pdrop): values that differ are refused. Refused by name as well:
``rotary_dim`` unset (transformers then builds its angles over the whole width, not a head's) or odd, and
activations blocklab does not have.
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
from .hf_phi import ACTIVATIONS
from .hf_tokenizer import HFTokenizer

MODEL_TYPE = "gptj"
name = "GPT-J"  # for messages and the lists of families
default_prepend_bos = True  # as TransformerLens' GPT-J (its default)
# Buffers of older files (the causal mask) and a tied head's weight: never read.
IGNORED = (r"transformer\.h\.\d+\.attn\.(bias|masked_bias)", r"lm_head\.weight")
ROTARY_BASE = 10000.0  # transformers' create_sinusoidal_positions: not a config field

# transformers' GPTJConfig defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50400, "n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
    "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "attn_pdrop": 0.0, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
}
DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
ATTENTION = {f"attn.{n}_proj": f"attn.{n}" for n in "qkv"} | {"attn.out_proj": "attn.o"}  # weights only
LAYER = {"ln_1": "ln1", "mlp.fc_in": "ffn.w1", "mlp.fc_out": "ffn.w2"}  # weights and biases
# The config fields the architecture fixes (import sets them, export checks them).
ARCHITECTURE = dict(
    norm_position="parallel_shared", norm="standard", residual="add", bias=True, qkv_bias=False, o_bias=False,
    head_bias=True, causal=True, pos_encoding="rotary", rotary_style="interleaved", rotary_base=ROTARY_BASE,
    rope_scaling=None, sliding_window=None, qk_norm="none", embed_norm=False, final_norm=True,
    type_vocab_size=0, embed_scale="none", positions_from_mask=False, n_kv_heads=None, head_dim=None,
    **PLAIN_SCORES)
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a GPT-J config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    act = require(hf, DEFAULTS, "activation_function", tuple(ACTIVATIONS))
    d_model, heads, rotary_dim = get("n_embd"), get("n_head"), get("rotary_dim")
    d_head = d_model // heads if isinstance(d_model, int) and isinstance(heads, int) and heads > 0 else None
    if not (isinstance(rotary_dim, int) and rotary_dim > 0 and rotary_dim % 2 == 0 and d_head
            and rotary_dim <= d_head):
        raise PretrainedError(f"config.json rotary_dim={rotary_dim!r} is not supported: blocklab reads an "
                              f"even number of each head's {d_head} features (transformers builds an unset "
                              "rotary_dim's angles over the whole width)")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("n_positions"), d_model=d_model, n_heads=heads,
        n_layers=get("n_layer"), d_ff=get("n_inner") or 4 * d_model, activation=ACTIVATIONS[act],
        eps=float(get("layer_norm_epsilon")), tie_embeddings=get("tie_word_embeddings"),
        dropout=same_dropouts(hf, DEFAULTS, DROPOUTS), rotary_fraction=rotary_dim / d_head,
        **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.GPTJForCausalLM``."""
    check_exportable(config, name, ARCHITECTURE)
    c = config
    eos = tokenizer.eos_id if tokenizer else None
    return {
        "architectures": ["GPTJForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "n_positions": c.max_seq_len, "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads,
        "rotary_dim": round(c.rotary_fraction * c.d_head), "n_inner": c.d_ff,
        "activation_function": export_activation(c, ACTIVATIONS), **{field: c.dropout for field in DROPOUTS},
        "layer_norm_epsilon": c.eps, "initializer_range": 0.02, "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": tokenizer.bos_id if tokenizer else eos, "eos_token_id": eos,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every GPTJForCausalLM tensor (without the ``transformer.`` prefix) and the blocklab tensor it is."""
    rows = [WeightMap("wte.weight", ("embed.weight",))]
    for i in range(config.n_layers):
        hf, us = f"h.{i}.", f"blocks.{i}."
        rows += renamed(hf, us, ATTENTION, params=("weight",)) + renamed(hf, us, LAYER)
    rows += renamed("", "", {"ln_f": "ln_f"})
    return rows + head_rows("lm_head", config)


def normalize_key(key: str) -> str:
    """GPTJForCausalLM keys (``transformer.`` prefix) -> GPTJModel's."""
    return key.removeprefix("transformer.")


def export_key(key: str) -> str:
    """GPTJForCausalLM's keys: the stack under ``transformer.``, the head beside it."""
    return key if key.startswith("lm_head.") else f"transformer.{key}"
