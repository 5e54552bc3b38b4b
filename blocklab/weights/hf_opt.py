"""OPT's layout (``transformers.OPTForCausalLM``) <-> blocklab's pre-norm causal stack with learned
positions, ReLU and biases: GPT-2's block with plain linear layers.

    model.decoder.embed_tokens                       -> embed
    model.decoder.embed_positions                    -> pos      (its first 2 rows dropped: OPT adds 2 to
                                                                  every position, so no token reads them)
    layers.{i}.self_attn_layer_norm                  -> blocks.{i}.ln1   (y = x + MHA(LN1(x)))
    layers.{i}.self_attn.{q,k,v,out}_proj            -> blocks.{i}.attn.q, k, v, o
    layers.{i}.final_layer_norm                      -> blocks.{i}.ln2   (z = y + FFN(LN2(y)))
    layers.{i}.fc1, fc2                              -> blocks.{i}.ffn.w1, w2
    model.decoder.final_layer_norm, lm_head          -> ln_f, head       (lm_head tied to embed_tokens)

transformers' OPT counts a left-padded row's positions from its first real token in every forward (GPT-2's
and Llama's do not): an imported OPT's config says so (``positions_from_mask``), and exporting it as another
family is refused, where transformers would count otherwise.

Refused by name: the post-norm variant (``do_layer_norm_before=false``, OPT-350m), a projection between
the embedding and the stack (``word_embed_proj_dim`` other than hidden_size), norms without gamma and beta,
no biases, and an activation blocklab does not have.
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

MODEL_TYPE = "opt"
name = "OPT"  # for messages and the lists of families
default_prepend_bos = True  # as TransformerLens (OPT's tokenizer puts </s> first itself)
IGNORED = (r"lm_head\.weight",)  # tied: read from embed_tokens
POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: row = position + 2

# transformers' OPTConfig defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072,
    "max_position_embeddings": 2048, "do_layer_norm_before": True, "_remove_final_layer_norm": False,
    "word_embed_proj_dim": None, "dropout": 0.1, "attention_dropout": 0.0, "num_attention_heads": 12,
    "activation_function": "relu", "layer_norm_elementwise_affine": True, "enable_bias": True,
    "tie_word_embeddings": True,
}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh"}  # export: the first of each

LAYER = {"self_attn_layer_norm": "ln1", "final_layer_norm": "ln2", "self_attn.q_proj": "attn.q",
         "self_attn.k_proj": "attn.k", "self_attn.v_proj": "attn.v", "self_attn.out_proj": "attn.o",
         "fc1": "ffn.w1", "fc2": "ffn.w2"}
ARCHITECTURE = dict(
    norm_position="pre", norm="standard", residual="add", bias=True, causal=True, pos_encoding="learned",
    embed_norm=False, final_norm=True, type_vocab_size=0, embed_scale="none", tie_embeddings=True,
    positions_from_mask=True,  # OPT's forward counts a row's positions from its first real token
    **PLAIN_BIASES, **PLAIN_SCORES)
INIT = dict(embed_std=0.02, init="default")  # transformers' init_std


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from an OPT config.json; what blocklab cannot honour refused, naming the field."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    for field, allowed in (("do_layer_norm_before", (True,)), ("_remove_final_layer_norm", (False,)),
                           ("layer_norm_elementwise_affine", (True,)), ("enable_bias", (True,)),
                           ("tie_word_embeddings", (True,)), ("attention_dropout", (0, 0.0))):
        require(hf, DEFAULTS, field, allowed)
    d_model = get("hidden_size")
    require(hf, DEFAULTS, "word_embed_proj_dim", (None, d_model))
    act = require(hf, DEFAULTS, "activation_function", tuple(ACTIVATIONS))
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=d_model,
        n_heads=get("num_attention_heads"), n_layers=get("num_hidden_layers"), d_ff=get("ffn_dim"),
        activation=ACTIVATIONS[act], dropout=float(get("dropout")), eps=1e-5, **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.OPTForCausalLM``."""
    check_exportable(config, name, {**ARCHITECTURE, "eps": 1e-5})
    c = config
    return {
        "architectures": ["OPTForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "num_hidden_layers": c.n_layers, "ffn_dim": c.d_ff,
        "max_position_embeddings": c.max_seq_len, "num_attention_heads": c.n_heads,
        "word_embed_proj_dim": c.d_model, "activation_function": export_activation(c, ACTIVATIONS),
        "do_layer_norm_before": True, "dropout": c.dropout, "attention_dropout": 0.0, "init_std": 0.02,
        "enable_bias": True, "layer_norm_elementwise_affine": True, "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_id if tokenizer else None,
        "eos_token_id": tokenizer.eos_id if tokenizer else None,
        "pad_token_id": tokenizer.pad_id if tokenizer else None,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every OPTForCausalLM tensor (without the ``model.decoder.`` prefix) and the blocklab tensor it is."""
    rows = [WeightMap("embed_tokens.weight", ("embed.weight",)),
            WeightMap("embed_positions.weight", ("pos.weight",), skip=POSITION_OFFSET)]
    for i in range(config.n_layers):
        rows += renamed(f"layers.{i}.", f"blocks.{i}.", LAYER)
    return rows + renamed("", "", {"final_layer_norm": "ln_f"})


def normalize_key(key: str) -> str:
    """OPTForCausalLM keys (``model.decoder.`` prefix) -> the decoder's own."""
    return key.removeprefix("model.decoder.")


def export_key(key: str) -> str:
    """OPTForCausalLM's keys: the decoder under ``model.decoder.``."""
    return f"model.decoder.{key}"
