"""Falcon's layout (``transformers.FalconForCausalLM``: falcon-7b, falcon-40b, falcon-rw, Falcon 2) <->
blocklab's rotary stack with LayerNorms, in one of three blocks:

    new_decoder_architecture, num_ln_in_parallel_attn 2 (or unset): ln_attn -> ln1, ln_mlp -> ln2, the block
        x + MHA(LN1(x)) + FFN(LN2(x))                               (layout parallel)
    new_decoder_architecture with num_ln_in_parallel_attn 1, or the old one with parallel_attn:
        input_layernorm -> ln1, x + MHA(LN1(x)) + FFN(LN1(x))      (layout parallel_shared)
    the old one without parallel_attn: input_layernorm -> ln1, post_attention_layernorm -> ln2   (pre-norm)

    transformer.word_embeddings                        -> embed
    transformer.h.{i}.self_attention.query_key_value   -> blocks.{i}.attn.q, k, v
    transformer.h.{i}.self_attention.dense             -> blocks.{i}.attn.o
    transformer.h.{i}.mlp.dense_h_to_4h, dense_4h_to_h -> blocks.{i}.ffn.w1, w2  (ffn_hidden_size; unset: 4 d)
    transformer.ln_f, lm_head                          -> ln_f, head  (lm_head: tied unless
                                                                       tie_word_embeddings is false)

query_key_value holds each key/value group in turn: its query heads, then its key head and its value head
(FalconAttention._split_heads). The new architecture has ``num_kv_heads`` groups; the old one with
``multi_query`` one group (q | k | v, one key/value head), without it one group per head ([q_h k_h v_h]).
``bias`` puts biases on every linear layer (the LayerNorms always have theirs). Rotary positions in halves
over each whole head. Refused by name: ``alibi`` (transformers scales Falcon's ALiBi bias by 1/sqrt(d_head)
in its eager path and not in its sdpa path: two models, neither blocklab's ALiBi), rope scaling, dropouts,
``num_kv_heads`` other than the heads in the old architecture without multi_query (its query_key_value has
one key per head), a block transformers cannot build (new architecture without parallel_attn; the old one
with two norms), ``apply_residual_connection_post_layernorm``.
"""

from __future__ import annotations

from typing import Any

from ..nn.config import ModelConfig

# GPT-2's keys, the same rule: the stack under ``transformer.``, lm_head beside it
from .hf_gpt2 import export_key as export_key
from .hf_gpt2 import normalize_key as normalize_key
from .hf_map import (
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

MODEL_TYPE = "falcon"
name = "Falcon"  # for messages and the lists of families
default_prepend_bos = False  # Falcon's tokenizer adds no BOS to text
IGNORED = (r"lm_head\.weight",)  # (when tied)

# transformers' FalconConfig defaults, for fields a config.json leaves out (falcon-7b's shape).
DEFAULTS: dict[str, Any] = {
    "vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
    "num_ln_in_parallel_attn": None, "layer_norm_epsilon": 1e-5, "hidden_dropout": 0.0,
    "attention_dropout": 0.0, "num_kv_heads": None, "alibi": False, "new_decoder_architecture": False,
    "multi_query": True, "parallel_attn": True, "bias": False, "max_position_embeddings": 2048,
    "rope_theta": 10000.0, "ffn_hidden_size": None, "activation": "gelu", "tie_word_embeddings": True,
    "apply_residual_connection_post_layernorm": False,
}
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "relu": "relu"}
# The config fields the architecture fixes (import sets them, export checks them); the layout, the biases of
# the linear layers and the key/value heads are read.
ARCHITECTURE = dict(
    norm="standard", residual="add", bias=True, head_bias=False, causal=True, pos_encoding="rotary",
    rotary_fraction=1.0, rotary_style="half", rope_scaling=None, sliding_window=None, qk_norm="none",
    embed_norm=False, final_norm=True, type_vocab_size=0, embed_scale="none", positions_from_mask=False,
    head_dim=None, n_experts=0, **PLAIN_SCORES)
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight
LAYER = {"self_attention.dense": "attn.o", "mlp.dense_h_to_4h": "ffn.w1", "mlp.dense_4h_to_h": "ffn.w2"}
# norm_position -> (new_decoder_architecture, num_ln_in_parallel_attn, parallel_attn) as export writes them
WRITTEN = {"parallel": (True, 2, True), "parallel_shared": (False, None, True), "pre": (False, None, False)}
NORMS = {"parallel": {"ln_attn": "ln1", "ln_mlp": "ln2"}, "parallel_shared": {"input_layernorm": "ln1"},
         "pre": {"input_layernorm": "ln1", "post_attention_layernorm": "ln2"}}


def _layout(hf: dict[str, Any]) -> str:
    """The block's layout from the three flags, as FalconDecoderLayer builds it; the combinations it cannot
    build (a missing norm at forward) refused by name."""
    new = hf_value(hf, DEFAULTS, "new_decoder_architecture")
    parallel = hf_value(hf, DEFAULTS, "parallel_attn")
    norms = hf_value(hf, DEFAULTS, "num_ln_in_parallel_attn")
    if new and not parallel:
        raise PretrainedError("config.json new_decoder_architecture=true with parallel_attn=false is not "
                              "supported: transformers' Falcon has no such block")
    if new:
        return "parallel_shared" if norms == 1 else "parallel"
    if parallel and norms == 2:
        raise PretrainedError("config.json num_ln_in_parallel_attn=2 is not supported without "
                              "new_decoder_architecture: transformers' Falcon has no such block")
    return "parallel_shared" if parallel else "pre"


def _kv_heads(hf: dict[str, Any], heads: Any) -> int | None:
    """The key/value heads: num_kv_heads (new architecture), one (multi_query) or one per head."""
    kv = hf_value(hf, DEFAULTS, "num_kv_heads")
    kv = heads if kv is None else kv
    if hf_value(hf, DEFAULTS, "new_decoder_architecture"):
        return None if kv == heads else kv
    if hf_value(hf, DEFAULTS, "multi_query"):
        return 1
    if kv != heads:
        raise PretrainedError(f"config.json num_kv_heads={kv!r} is not supported without multi_query in the "
                              f"old architecture: its query_key_value has a key and a value per head "
                              f"({heads})")
    return None


def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Falcon config.json; every field blocklab cannot honour refused, naming it."""
    get = lambda field: hf_value(hf, DEFAULTS, field)
    require(hf, DEFAULTS, "alibi", (False,))  # see the module's docstring
    require(hf, DEFAULTS, "apply_residual_connection_post_layernorm", (False,))
    act = require(hf, DEFAULTS, "activation", tuple(ACTIVATIONS))
    for field in ("hidden_dropout", "attention_dropout"):
        require(hf, DEFAULTS, field, (0, 0.0))
    if hf.get("rope_scaling") is not None:
        raise PretrainedError(f"config.json rope_scaling={hf['rope_scaling']!r} is not supported for Falcon "
                              "(supported: null)")
    d_model, heads = get("hidden_size"), get("num_attention_heads")
    linear_bias = None if require(hf, DEFAULTS, "bias", (True, False)) else False
    d_ff = get("ffn_hidden_size")
    return ModelConfig(
        vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=d_model,
        n_heads=heads, n_kv_heads=_kv_heads(hf, heads), n_layers=get("num_hidden_layers"),
        d_ff=4 * d_model if d_ff is None and isinstance(d_model, int) else d_ff,
        activation=ACTIVATIONS[act], eps=float(get("layer_norm_epsilon")),
        tie_embeddings=get("tie_word_embeddings"), norm_position=_layout(hf),
        qkv_bias=linear_bias, o_bias=linear_bias, ffn_bias=linear_bias,
        rotary_base=float(get("rope_theta")),
        **ARCHITECTURE, **INIT,
    )


def hf_config(config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
    """config.json for ``transformers.FalconForCausalLM``: the old architecture where it holds the model
    (parallel_shared, pre-norm; one key/value head or one per head), else the new one."""
    check_exportable(config, name, ARCHITECTURE)
    c = config
    biases = {c.has_qkv_bias, c.has_o_bias, c.has_ffn_bias}
    if len(biases) > 1 or c.norm_position not in WRITTEN:
        raise PretrainedError(f"this model has no {name} layout: ModelConfig qkv_bias={c.qkv_bias!r}, o_bias="
                              f"{c.o_bias!r}, ffn_bias={c.ffn_bias!r}, norm_position={c.norm_position!r} "
                              "(needs one bias flag for every linear layer, and one of "
                              f"{', '.join(WRITTEN)})")
    new, norms, parallel = WRITTEN[c.norm_position]
    if not new and c.kv_heads not in (1, c.n_heads):
        if c.norm_position == "pre":
            raise PretrainedError(f"this model has no {name} layout: ModelConfig n_kv_heads={c.n_kv_heads!r} "
                                  "(the pre-norm block is Falcon's old architecture: 1 or n_heads)")
        new, norms = True, 1  # grouped heads: the new architecture's shared norm
    return {
        "architectures": ["FalconForCausalLM"], "model_type": MODEL_TYPE, "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
        "num_kv_heads": c.kv_heads, "new_decoder_architecture": new, "num_ln_in_parallel_attn": norms,
        "multi_query": c.kv_heads == 1, "parallel_attn": parallel, "alibi": False, "bias": biases == {True},
        "layer_norm_epsilon": c.eps, "initializer_range": 0.02, "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "max_position_embeddings": c.max_seq_len, "rope_theta": c.rotary_base, "rope_scaling": None,
        "ffn_hidden_size": c.d_ff, "activation": export_activation(c, ACTIVATIONS),
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": tokenizer.bos_id if tokenizer else None,
        "eos_token_id": tokenizer.eos_id if tokenizer else None,
    }


def weight_map(config: ModelConfig) -> list[WeightMap]:
    """Every FalconForCausalLM tensor (without the ``transformer.`` prefix) and the blocklab tensors it is."""
    params = ("weight", "bias") if config.has_qkv_bias else ("weight",)
    rows = [WeightMap("word_embeddings.weight", ("embed.weight",))]
    for i in range(config.n_layers):
        hf, us = f"h.{i}.", f"blocks.{i}."
        rows += renamed(hf, us, NORMS[config.norm_position])
        rows += [WeightMap(f"{hf}self_attention.query_key_value.{p}",
                           tuple(f"{us}attn.{n}.{p}" for n in "qkv"), heads=config.kv_heads)
                 for p in params]  # one group per key/value head
        rows += renamed(hf, us, LAYER, params=params)
    rows += renamed("", "", {"ln_f": "ln_f"})
    if not config.tie_embeddings:
        rows.append(WeightMap("lm_head.weight", ("head.weight",)))
    return rows

