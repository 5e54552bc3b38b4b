"""The Llama layout (``transformers.LlamaForCausalLM``; Mistral's, Qwen2's and Qwen3's are the same
tensors, OLMo 2's the same with its norms moved) <-> blocklab's rotary stack with RMSNorm, SwiGLU and
grouped-query attention.

    model.embed_tokens                                 -> embed
    model.layers.{i}.input_layernorm                   -> blocks.{i}.ln1      (RMSNorm, no bias)
    model.layers.{i}.self_attn.{q,k,v,o}_proj          -> blocks.{i}.attn.q, k, v, o
    model.layers.{i}.self_attn.{q,k}_norm              -> blocks.{i}.attn.q_norm, k_norm  (Qwen3, OLMo 2)
    model.layers.{i}.post_attention_layernorm          -> blocks.{i}.ln2
    model.layers.{i}.mlp.gate_proj, up_proj, down_proj -> blocks.{i}.ffn.w1, w3, w2   (silu(W1 x) * W3 x)
    model.norm, lm_head                                -> ln_f, head          (lm_head: tied or not)

The families differ in their config only: Mistral adds a sliding window, Qwen2 biases on q, k and v and
sliding windows on some layers (``use_sliding_window``: those from ``max_window_layers`` on, or as
``layer_types`` says; Qwen3 too) -> layer_windows,
Gemma its RMSNorm's scale 1 + w (``rms_plus_one``), GEGLU with GELU's tanh form (``geglu_tanh``), token
embeddings times sqrt(hidden_size) and heads 256 wide,
OLMo 1 LayerNorms without parameters (``nonparametric``: no gamma, no beta, eps 1e-5; its norms have no
rows), Qwen3 QK-norm per head, and a head width of its own (``head_dim``, 128 whatever hidden_size:
Qwen3-0.6B's 16 heads of 128 on a width of 1024; Llama and Mistral may set one too). OLMo 2 normalises each
sublayer's output instead of its input (layout ``res_post``: post_attention_layernorm -> ln1_out,
post_feedforward_layernorm -> ln2_out) and its QK-norm spans all heads. Mixtral puts a mixture of experts
(blocklab/nn/moe.py) in the MLP's place:

    model.layers.{i}.block_sparse_moe.gate                  -> blocks.{i}.ffn.router
    model.layers.{i}.block_sparse_moe.experts.{e}.w1, w2, w3 -> blocks.{i}.ffn.experts.{e}.w1, w2, w3

with softmax over the experts before top-k and the k weights renormalised (num_experts_per_tok of
num_local_experts); its router_aux_loss_coef is the training coefficient. Qwen2-MoE, Qwen3-MoE and OLMoE
keep theirs in the MLP's own name (``MoELayout``), renormalise the k weights only with ``norm_topk_prob``,
and take each expert's width from ``moe_intermediate_size`` (OLMoE: ``intermediate_size``):

    model.layers.{i}.mlp.gate                                      -> blocks.{i}.ffn.router
    model.layers.{i}.mlp.experts.{e}.gate_proj, up_proj, down_proj -> blocks.{i}.ffn.experts.{e}.w1, w3, w2
    model.layers.{i}.mlp.shared_expert.gate_proj, up_proj, down_proj -> blocks.{i}.ffn.shared.w1, w3, w2
    model.layers.{i}.mlp.shared_expert_gate                        -> blocks.{i}.ffn.shared_gate  (Qwen2-MoE)

Qwen2-MoE adds its shared expert behind a sigmoid gate and Qwen2's q/k/v biases, Qwen3-MoE Qwen3's QK-norm
per head, OLMoE a QK-norm over all heads in a pre-norm block. A config field blocklab cannot honour
(another rope scaling, biases on o or the MLP, attention dropout, Qwen-MoE's windows, dense layers among
the mixtures, OLMoE's clip_qkv) is refused, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..nn.config import ModelConfig
from ..nn.norm_kinds import NORM_KINDS
from .hf_map import (
    PLAIN_BIASES,
    PLAIN_SCORES,
    PretrainedError,
    WeightMap,
    check_exportable,
    hf_value,
    one_window_layer_types,
    renamed,
    require,
    window_fields,
    windows_from_layer_types,
)
from .hf_tokenizer import HFTokenizer

LAYER = {
    "input_layernorm": "ln1", "post_attention_layernorm": "ln2",
    "self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k", "self_attn.v_proj": "attn.v",
    "self_attn.o_proj": "attn.o",
    "mlp.gate_proj": "ffn.w1", "mlp.up_proj": "ffn.w3", "mlp.down_proj": "ffn.w2",
}
# transformers' LlamaConfig defaults, for fields a config.json leaves out (Mistral and Qwen2 override some).
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
    "mlp_bias": False, "head_dim": None, "pretraining_tp": 1,
}
# The config fields the architecture fixes (import sets them, export checks them); a family may fix
# some otherwise (``LlamaFamily.fixes``: Qwen3's QK-norm, OLMo 2's layout).
ARCHITECTURE = dict(
    norm_position="pre", norm="rms", residual="add", bias=False, causal=True,
    pos_encoding="rotary", rotary_fraction=1.0, rotary_style="half", embed_norm=False, final_norm=True,
    type_vocab_size=0, embed_scale="none", qk_norm="none",  # x0 = embed_tokens[t]: no factor, no positions
    positions_from_mask=False, **PLAIN_BIASES, **PLAIN_SCORES)
# (the activation is each family's hidden_act's: LlamaFamily.activations)
QK_NORMS = {"self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm"}
# OLMo 2's block: a norm after each sublayer, before its residual add (layout res_post), and QK-norm
OLMO2_LAYER = {
    **{hf: ours for hf, ours in LAYER.items() if not hf.endswith("layernorm")}, **QK_NORMS,
    "post_attention_layernorm": "ln1_out", "post_feedforward_layernorm": "ln2_out",
}
INIT = dict(embed_std=0.02, init="default")  # initializer_range: how transformers draws every weight


@dataclass(frozen=True)
class MoELayout:
    """Where a family keeps its mixture of experts (blocklab/nn/moe.py) and what its config.json calls it."""

    module: str  # the layer's submodule holding router and experts: Mixtral's block_sparse_moe, others' mlp
    fields: dict[str, str]  # config.json name -> ModelConfig field (n_experts first)
    matrices: dict[str, str]  # an expert's linear layers -> FeedForward's
    allowed: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # honoured with these values only
    shared_expert: bool = False  # a shared expert behind a sigmoid gate, always (Qwen2-MoE)
    dense_layers: bool = False  # config.json may make layers dense (decoder_sparse_step, mlp_only_layers)

    def rows(self, n_experts: int, shared: bool) -> dict[str, str]:
        """One layer's mixture modules -> blocklab's, inside model.layers.{i} and blocks.{i}."""
        m, matrices = self.module, self.matrices.items()
        rows = {f"{m}.gate": "ffn.router", **{f"{m}.experts.{e}.{theirs}": f"ffn.experts.{e}.{ours}"
                                              for e in range(n_experts) for theirs, ours in matrices}}
        if shared:
            rows |= {f"{m}.shared_expert.{theirs}": f"ffn.shared.{ours}" for theirs, ours in matrices}
            rows[f"{m}.shared_expert_gate"] = "ffn.shared_gate"
        return rows


@dataclass(frozen=True)
class LlamaFamily:
    """One family of the Llama layout: its model_type, defaults and the fields it honours."""

    MODEL_TYPE: str
    name: str  # for messages: "Llama"
    architecture: str  # the transformers class export names
    defaults: dict[str, Any]
    window: bool = False  # honours sliding_window (Mistral)
    layer_kinds: bool = False  # each layer full or sliding by layer_types / max_window_layers (Qwen2, 3)
    qkv_bias: bool = False  # biases on q, k, v (Qwen2)
    fixes: dict[str, Any] = field(default_factory=dict)  # ARCHITECTURE fields it fixes otherwise
    layer: dict[str, str] = field(default_factory=lambda: dict(LAYER))  # its layer's modules -> blocklab's
    IGNORED: tuple[str, ...] = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight")
    default_prepend_bos: bool = True  # as TransformerLens (the tokenizers add their own BOS)
    activations: dict[str, str] = field(default_factory=lambda: {"silu": "swiglu"})  # hidden_act -> blocklab
    moe: MoELayout | None = None  # a mixture of experts in the MLP's place (Mixtral, Qwen-MoE, OLMoE)

    def config_from_hf(self, hf: dict[str, Any]) -> ModelConfig:
        """ModelConfig from a config.json of this family; every field blocklab cannot honour refused."""
        get = lambda name: hf_value(hf, self.defaults, name)
        activation = self.activations.get(require(hf, self.defaults, "hidden_act", tuple(self.activations)))
        require(hf, self.defaults, "attention_dropout", (0, 0.0))
        for name in ("attention_bias", "mlp_bias"):
            if name in self.defaults:
                require(hf, self.defaults, name, (False,))
        if "pretraining_tp" in self.defaults:
            require(hf, self.defaults, "pretraining_tp", (1,))
        d_model, heads = get("hidden_size"), get("num_attention_heads")
        head_dim = get("head_dim") if "head_dim" in self.defaults else None
        if head_dim is not None and isinstance(heads, int) and head_dim * heads == d_model:
            head_dim = None  # the width the heads have anyway: unset, as blocklab writes it
        fields = dict(
            vocab_size=get("vocab_size"), max_seq_len=get("max_position_embeddings"), d_model=d_model,
            n_heads=heads, n_kv_heads=get("num_key_value_heads"), head_dim=head_dim,
            n_layers=get("num_hidden_layers"),
            d_ff=get("intermediate_size"), eps=float(get("rms_norm_eps")),
            tie_embeddings=get("tie_word_embeddings"), rotary_base=float(get("rope_theta")),
            rope_scaling=_rope_scaling(hf.get("rope_scaling")), **self._windows(hf, get("num_hidden_layers")),
            qkv_bias=True if self.qkv_bias else None, activation=activation,
        ) | self.architecture_fields | INIT  # what the family fixes over what it reads (OLMo's eps)
        if hf.get("clip_qkv") is not None and "clip_qkv" in self.defaults:  # (null: no clipping)
            raise PretrainedError(f"config.json clip_qkv={hf['clip_qkv']!r} is not supported: blocklab does "
                                  "not clamp q, k and v (supported: null)")
        return ModelConfig(**fields | (self._experts_from_hf(hf, fields["n_layers"]) if self.moe else {}))

    def _experts_from_hf(self, hf: dict[str, Any], n_layers: Any) -> dict[str, Any]:
        """The mixture's fields from config.json (the family's names; an expert's width replaces d_ff where
        it has its own); a value it cannot honour refused by name (router jitter: training noise blocklab
        does not draw; clip_qkv; a layer made dense)."""
        assert self.moe is not None
        for name, allowed in self.moe.allowed.items():
            value = hf.get(name, self.defaults[name])
            if value not in allowed:
                raise PretrainedError(f"config.json {name}={value!r} is not supported; blocklab supports "
                                      + ", ".join(map(repr, allowed)))
        fields = {ours: hf_value(hf, self.defaults, theirs) for theirs, ours in self.moe.fields.items()}
        for theirs, ours in self.moe.fields.items():  # experts, and a shared one of some width
            value = fields[ours]
            if ours in ("n_experts", "shared_expert_d_ff") and not (isinstance(value, int) and value >= 1):
                raise PretrainedError(f"config.json {theirs}={value!r}: {self.name} needs at least one")
        if self.moe.dense_layers:
            _refuse_dense_layers(hf, self.defaults, n_layers)
        return fields

    @property
    def architecture_fields(self) -> dict[str, Any]:
        """The config fields this family's architecture fixes (the activation is its hidden_act's)."""
        fixed = {**ARCHITECTURE, **self.fixes}
        return {k: v for k, v in fixed.items() if k != "layer_windows"} if self.layer_kinds else fixed

    def _windows(self, hf: dict[str, Any], n_layers: Any) -> dict[str, Any]:
        """sliding_window, and layer_windows where the family sets each layer's kind."""
        if self.layer_kinds:
            return qwen_windows(hf, self.defaults, n_layers)
        if "use_sliding_window" in self.defaults:  # Qwen-MoE: its own rule for which layers slide
            if hf_value(hf, self.defaults, "use_sliding_window"):
                raise PretrainedError(f"config.json use_sliding_window=true is not supported: {self.name} "
                                      "windows only some layers (max_window_layers), which blocklab does "
                                      "not read for this family")
            return {"sliding_window": None}
        if not self.window or ("sliding_window" in hf and hf["sliding_window"] is None):  # null: no window
            return {"sliding_window": None}
        return {"sliding_window": hf_value(hf, self.defaults, "sliding_window")}

    def hf_config(self, config: ModelConfig, tokenizer: HFTokenizer | None = None) -> dict[str, Any]:
        """config.json for ``transformers``' class of this family."""
        needed = {**self.architecture_fields, "qkv_bias": True if self.qkv_bias else None}
        if not self.moe:
            needed["n_experts"] = 0  # no place for experts in the family's files
        elif self.moe.shared_expert and not config.shared_expert_d_ff:
            raise PretrainedError(f"this model has no {self.name} layout: ModelConfig shared_expert_d_ff=0 "
                                  "(needs a shared expert)")
        hidden_act = {ours: theirs for theirs, ours in self.activations.items()}
        if config.activation not in hidden_act:  # named as the family's first activation
            check_exportable(config, self.name, {**needed, "activation": next(iter(hidden_act))})
        if not self.window and not self.layer_kinds:
            needed["sliding_window"] = None
        check_exportable(config, self.name, needed)
        c = config
        out = {
            "architectures": [self.architecture], "model_type": self.MODEL_TYPE,
            "vocab_size": c.vocab_size, "hidden_size": c.d_model, "intermediate_size": c.d_ff,
            "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
            "num_key_value_heads": c.kv_heads, "hidden_act": hidden_act[c.activation],
            "max_position_embeddings": c.max_seq_len,
            "rms_norm_eps": c.eps, "tie_word_embeddings": c.tie_embeddings, "rope_theta": c.rotary_base,
            "rope_scaling": c.rope_scaling, "attention_dropout": 0.0, "initializer_range": 0.02,
            "bos_token_id": tokenizer.bos_id if tokenizer else None,
            "eos_token_id": tokenizer.eos_id if tokenizer else None,
        }
        if self.window:
            out["sliding_window"] = c.sliding_window
        if self.layer_kinds:
            out |= qwen_layer_kinds(config, self.name)
        elif "use_sliding_window" in self.defaults:
            out["use_sliding_window"] = False
        if "clip_qkv" in self.defaults:  # OLMo's, OLMoE's: no clamping
            out["clip_qkv"] = None
        if "head_dim" in self.defaults:  # Qwen3's default is 128 whatever the width
            out["head_dim"] = c.d_head
        if self.moe:
            out |= {theirs: getattr(c, ours) for theirs, ours in self.moe.fields.items()}
            out |= {name: allowed[0] for name, allowed in self.moe.allowed.items()}
        return out

    def weight_map(self, config: ModelConfig) -> list[WeightMap]:
        """Every LlamaForCausalLM tensor and the blocklab tensor it is."""
        rows = [WeightMap("model.embed_tokens.weight", ("embed.weight",))]
        for i in range(config.n_layers):
            rows += renamed(f"model.layers.{i}.", f"blocks.{i}.", self.layer, params=("weight",))
            if self.moe:
                rows += renamed(f"model.layers.{i}.", f"blocks.{i}.",
                                self.moe.rows(config.n_experts, bool(config.shared_expert_d_ff)),
                                params=("weight",))
            if config.has_qkv_bias:
                rows += renamed(f"model.layers.{i}.", f"blocks.{i}.",
                                {f"self_attn.{n}_proj": f"attn.{n}" for n in "qkv"}, params=("bias",))
        if NORM_KINDS[config.norm].scale:  # (OLMo's norms have no parameters)
            rows.append(WeightMap("model.norm.weight", ("ln_f.weight",)))
        if not config.tie_embeddings:
            rows.append(WeightMap("lm_head.weight", ("head.weight",)))
        return rows

    def normalize_key(self, key: str) -> str:
        """The keys are the same in every file (LlamaForCausalLM's)."""
        return key

    def export_key(self, key: str) -> str:
        return key


def _refuse_dense_layers(hf: dict[str, Any], defaults: dict[str, Any], n_layers: Any) -> None:
    """Qwen-MoE's layer i is a mixture when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step
    == 0, else a dense MLP: blocklab's layers all have one FFN kind, so any value making a layer dense is
    refused (a step other than 1 makes layer 0 dense)."""
    require(hf, defaults, "decoder_sparse_step", (1,))
    listed = hf.get("mlp_only_layers") or []
    if not isinstance(listed, list):
        raise PretrainedError(f"config.json mlp_only_layers={listed!r} must be a list of layer numbers")
    dense = [i for i in listed if isinstance(i, int) and 0 <= i < n_layers]
    if dense:
        raise PretrainedError(f"config.json mlp_only_layers={listed!r} makes layers {dense} dense MLPs among "
                              "the mixtures; blocklab's layers all have the same FFN kind")


def qwen_windows(hf: dict[str, Any], defaults: dict[str, Any], n_layers: Any) -> dict[str, Any]:
    """transformers' Qwen2Config / Qwen3Config: sliding_window counts only with use_sliding_window; layer i
    slides where layer_types says sliding_attention, or (no layer_types) where a window is set and
    i >= max_window_layers. The same window on every layer is read as sliding_window (Mistral's form)."""
    window = hf.get("sliding_window", defaults["sliding_window"]) \
        if hf_value(hf, defaults, "use_sliding_window") else None
    kinds = hf.get("layer_types")
    if kinds is None and isinstance(n_layers, int):
        first = hf_value(hf, defaults, "max_window_layers")  # the layers before it are full
        kinds = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(n_layers)]
    return window_fields(windows_from_layer_types(kinds, window, n_layers))


def qwen_layer_kinds(config: ModelConfig, family: str) -> dict[str, Any]:
    """config.json's window fields for Qwen2 / Qwen3: layer_types (which transformers reads first) and
    max_window_layers as the count of full layers before the first sliding one (what transformers before
    layer_types read; exact for windows on the last layers only)."""
    kinds, window = one_window_layer_types(config, family)
    first = kinds.index("sliding_attention") if window is not None else config.n_layers
    return {"use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": first,
            "layer_types": kinds}


def _rope_scaling(value: Any) -> dict[str, Any] | None:
    """config.json's rope_scaling in blocklab's form (ModelConfig refuses what it cannot compute);
    transformers' older ``type`` key is read as ``rope_type``."""
    if not isinstance(value, dict):
        return value
    value = dict(value)
    if "type" in value:
        value.setdefault("rope_type", value.pop("type"))
    return value


LLAMA = LlamaFamily("llama", "Llama", "LlamaForCausalLM", LLAMA_DEFAULTS)
MISTRAL = LlamaFamily("mistral", "Mistral", "MistralForCausalLM", {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp")},
    "intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
    "sliding_window": 4096}, window=True)
QWEN2 = LlamaFamily("qwen2", "Qwen2", "Qwen2ForCausalLM", {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k not in ("attention_bias", "mlp_bias", "pretraining_tp",
                                                             "head_dim")},
    "vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768,
    "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}, qkv_bias=True,
    layer_kinds=True, default_prepend_bos=False)  # (as TransformerLens' Qwen2 and Qwen3: text gets no BOS)
QWEN3 = LlamaFamily("qwen3", "Qwen3", "Qwen3ForCausalLM", {
    **QWEN2.defaults, "intermediate_size": 22016, "head_dim": 128,
    "attention_bias": False}, fixes={"qk_norm": "head"}, layer={**LAYER, **QK_NORMS}, layer_kinds=True,
    default_prepend_bos=False)
GEMMA = LlamaFamily("gemma", "Gemma", "GemmaForCausalLM", {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k not in ("mlp_bias", "pretraining_tp")},
    "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "tie_word_embeddings": True},
    fixes={"norm": "rms_plus_one", "embed_scale": "sqrt_d_model"},
    activations={"gelu_pytorch_tanh": "geglu_tanh", "gelu": "geglu"})
# Mixtral's mixture: its config.json fields -> blocklab's (the routing is fixed: the family's fixes)
MIXTRAL = LlamaFamily("mixtral", "Mixtral", "MixtralForCausalLM", {
    **MISTRAL.defaults, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None,
    "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0},
    window=True, fixes={"router_softmax": "before_top_k", "renormalize_top_k": True, "shared_expert_d_ff": 0},
    layer={hf: ours for hf, ours in LAYER.items() if not hf.startswith("mlp.")},
    moe=MoELayout("block_sparse_moe", {"num_local_experts": "n_experts",
                                       "num_experts_per_tok": "experts_per_token",
                                       "router_aux_loss_coef": "router_aux_loss_coef"},
                  {"w1": "w1", "w2": "w2", "w3": "w3"}, allowed={"router_jitter_noise": (0.0, 0)}))
# Qwen2-MoE, Qwen3-MoE and OLMoE: softmax over all experts, the k largest, renormalised by norm_topk_prob
QWEN_MOE_FIELDS = {"num_experts": "n_experts", "num_experts_per_tok": "experts_per_token",
                   "moe_intermediate_size": "d_ff", "norm_topk_prob": "renormalize_top_k",
                   "router_aux_loss_coef": "router_aux_loss_coef"}
MOE_MATRICES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
MOE_DEFAULTS = {"num_experts_per_tok": 8, "norm_topk_prob": False, "router_aux_loss_coef": 0.001,
                "decoder_sparse_step": 1, "mlp_only_layers": []}
ROUTED = {"router_softmax": "before_top_k"}
QWEN2_MOE = LlamaFamily("qwen2_moe", "Qwen2-MoE", "Qwen2MoeForCausalLM", {
    **QWEN2.defaults, **MOE_DEFAULTS, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60, "qkv_bias": True},
    qkv_bias=True, fixes=ROUTED, layer={hf: ours for hf, ours in LAYER.items() if not hf.startswith("mlp.")},
    moe=MoELayout("mlp", {**QWEN_MOE_FIELDS, "shared_expert_intermediate_size": "shared_expert_d_ff"},
                  MOE_MATRICES, allowed={"qkv_bias": (True,)}, shared_expert=True, dense_layers=True))
QWEN3_MOE = LlamaFamily("qwen3_moe", "Qwen3-MoE", "Qwen3MoeForCausalLM", {
    **QWEN3.defaults, **MOE_DEFAULTS, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": 4, "moe_intermediate_size": 768, "num_experts": 128,
    "head_dim": None},  # Qwen3MoeConfig has no head_dim default: hidden_size / heads unless config.json says
    fixes={**QWEN3.fixes, **ROUTED, "shared_expert_d_ff": 0},
    layer={hf: ours for hf, ours in QWEN3.layer.items() if not hf.startswith("mlp.")},
    moe=MoELayout("mlp", QWEN_MOE_FIELDS, MOE_MATRICES, dense_layers=True))
OLMOE = LlamaFamily("olmoe", "OLMoE", "OlmoeForCausalLM", {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k not in ("mlp_bias", "pretraining_tp", "head_dim")},
    "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "clip_qkv": None,
    "num_experts_per_tok": 8, "num_experts": 64, "router_aux_loss_coef": 0.01, "norm_topk_prob": False},
    fixes={"qk_norm": "all_heads", **ROUTED, "shared_expert_d_ff": 0},
    layer={**{hf: ours for hf, ours in LAYER.items() if not hf.startswith("mlp.")}, **QK_NORMS},
    moe=MoELayout("mlp", {k: v for k, v in QWEN_MOE_FIELDS.items() if k != "moe_intermediate_size"},
                  MOE_MATRICES, allowed={"clip_qkv": (None,)}))
# OLMo 1: Llama's tensors with LayerNorms that have no parameters (OlmoLayerNorm, eps 1e-5 whatever the
# config says: it reads none), so the layers' and the final norm's rows are absent
OLMO = LlamaFamily("olmo", "OLMo", "OlmoForCausalLM", {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k not in ("mlp_bias", "pretraining_tp", "head_dim")},
    "vocab_size": 50304, "rms_norm_eps": 1e-5, "clip_qkv": None},
    fixes={"norm": "nonparametric", "eps": 1e-5},
    layer={hf: ours for hf, ours in LAYER.items() if not hf.endswith("layernorm")})
OLMO2 = LlamaFamily("olmo2", "OLMo 2", "Olmo2ForCausalLM", {
    **{k: v for k, v in LLAMA_DEFAULTS.items() if k not in ("mlp_bias", "pretraining_tp", "head_dim")},
    "vocab_size": 50304, "rms_norm_eps": 1e-5}, fixes={"qk_norm": "all_heads", "norm_position": "res_post"},
    layer=OLMO2_LAYER)
