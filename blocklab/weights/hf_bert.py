"""BERT's layout (``transformers.BertModel``) <-> blocklab's post-norm stack.

    embeddings: word + position + token_type, then LayerNorm    -> embed, pos, token_type, embed_ln
    attention.self.{query,key,value}                             -> attn.q, attn.k, attn.v
    attention.output.dense, attention.output.LayerNorm           -> attn.o, ln1   (y = LN1(x + MHA(x)))
    intermediate.dense, output.dense, output.LayerNorm           -> ffn.w1, ffn.w2, ln2

No final norm; the LM head is tied to the word embeddings (``forward``'s logits are then
hidden @ E^T; ``encode`` gives the hidden states BertModel returns). BERT's pooler has no blocklab
counterpart: import skips it, export omits it (``transformers`` then initialises the pooler at random,
which ``last_hidden_state`` does not use). Its pre-training heads (``cls.*``: BertForMaskedLM's MLM head,
BertForPreTraining's next-sentence head) are refused, naming them: blocklab's tied head is not the MLM
head (dense, GELU, LayerNorm, then the decoder), so loading without it would give other logits.
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

MODEL_TYPE = "bert"
name = "BERT"  # for messages and the lists of families
default_prepend_bos = True  # as TransformerLens: text gets the BOS token first (where it has one)
IGNORED = (r"embeddings\.position_ids", r"pooler\..*")
_ENCODER_ONLY = ("blocklab loads BERT encoders (BertModel): save the encoder alone with transformers "
                 "(AutoModel.from_pretrained(folder).save_pretrained(out)) and load that, whose logits are "
                 "the tied head's hidden @ E^T")
REFUSED = {
    r"cls\.predictions\..*": "BertForMaskedLM's MLM head (dense, GELU, LayerNorm, then the decoder) is "
                             "not blocklab's tied head, so model(ids) would not give its logits; "
                             + _ENCODER_ONLY,
    r"cls\.seq_relationship\..*": "BertForPreTraining's next-sentence head has no blocklab counterpart; "
                                  + _ENCODER_ONLY,
}

# transformers' BertConfig defaults, for fields a config.json leaves out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    "position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False,
}
# Hugging Face activation name -> blocklab's; export uses the first name listed for each.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "quick_gelu": "gelu_sigmoid"}

LAYER = {
    "attention.self.query": "attn.q", "attention.self.key": "attn.k", "attention.self.value": "attn.v",
    "attention.output.dense": "attn.o", "attention.output.LayerNorm": "ln1",
    "intermediate.dense": "ffn.w1", "output.dense": "ffn.w2", "output.LayerNorm": "ln2",
}
EMBEDDINGS = {"word_embeddings": "embed", "position_embeddings": "pos", "token_type_embeddings": "token_type"}

# The config fields BERT's architecture fixes (import sets them, export checks them).
ARCHITECTURE = dict(
    norm_position="post", norm="standard", residual="add", bias=True, causal=False,
    pos_encoding="learned", embed_norm=True, final_norm=False, tie_embeddings=True,
    embed_scale="none", positions_from_mask=False,  # x0 = LayerNorm(word + position + token_type): no factor
    **PLAIN_BIASES, **PLAIN_SCORES)
# How BERT initialises its tables (initializer_range): imported configs say so.
INIT = dict(embed_std=0.02, init="default")


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a BERT config.json."""
    get = lambda name: hf_value(hf, DEFAULTS, name)
    require(hf, DEFAULTS, "position_embedding_type", ("absolute",))
    require(hf, DEFAULTS, "is_decoder", (False,))
    require(hf, DEFAULTS, "add_cross_attention", (False,))
    act = require(hf, DEFAULTS, "hidden_act", tuple(ACTIVATIONS))
    types = get("type_vocab_size")
    if types < 1:  # BertEmbeddings adds token_type_embeddings(0) to every token: its table has a row
        raise PretrainedError(f"config.json type_vocab_size={types!r} must be an integer >= 1: BERT adds a "
                              "token-type embedding to every token")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=get("hidden_size"),
        n_heads=get("num_attention_heads"), n_layers=get("num_hidden_layers"), d_ff=get("intermediate_size"),
        activation=ACTIVATIONS[act], eps=float(get("layer_norm_eps")),
        dropout=float(get("hidden_dropout_prob")), type_vocab_size=types,
        **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.BertModel``."""
    check_exportable(config, "BERT", ARCHITECTURE)
    if config.type_vocab_size < 1:
        raise PretrainedError("this model has no BERT layout: ModelConfig type_vocab_size=0 (needs >= 1)")
    c = config
    return {
        "architectures": ["BertModel"], "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
        "hidden_act": export_activation(c, ACTIVATIONS), "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.dropout, "max_position_embeddings": c.max_seq_len,
        "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.eps, "initializer_range": 0.02,
        "position_embedding_type": "absolute", "pad_token_id": tokenizer.pad_id if tokenizer else 0,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every BertModel tensor and the blocklab tensor it is."""
    rows = renamed("embeddings.", "", EMBEDDINGS, params=("weight",))
    rows += renamed("embeddings.", "", {"LayerNorm": "embed_ln"})
    for i in range(config.n_layers):
        rows += renamed(f"encoder.layer.{i}.", f"blocks.{i}.", LAYER)
    return rows


def normalize_key(key: str) -> str:
    """BertForX keys (``bert.`` prefix) and old TF-style names (``gamma``/``beta``) -> BertModel's."""
    key = key.removeprefix("bert.")
    if key.endswith(".gamma"):
        return key.removesuffix(".gamma") + ".weight"
    return key.removesuffix(".beta") + ".bias" if key.endswith(".beta") else key


def export_key(key: str) -> str:
    """BertModel's own keys carry no prefix."""
    return key
