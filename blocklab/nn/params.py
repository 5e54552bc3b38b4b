"""Analytic parameter counts (docs/concepts.md#parameter-counts), per component, without building the model.

Worked examples: LayerNorm d=64 -> 128; FFN d=64, d_ff=256 -> 33,088; attention d=64 -> 16,384
(without biases; 16,640 with). GPT-2 small with tied embeddings -> 124,439,808.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .activation_kinds import activation_kind
from .attention import attention_parameter_count, qk_norm_widths
from .config import ModelConfig
from .feedforward import ffn_parameter_count
from .ffn_kinds import moe_parameters
from .layouts import LAYOUTS
from .norms import norm_parameter_count
from .position_kinds import POSITION_KINDS


@dataclass(frozen=True)
class ParamCount:
    """``total`` and its breakdown: ``components`` sum to the total; ``per_layer`` is one block.
    ``active``: the parameters one token is computed with (a mixture of experts uses k of its E experts;
    otherwise the total). ``ffn_parts``: a mixture's ``ffn`` of one block split into its parts (router,
    experts, shared_expert; they sum to ``per_layer["ffn"]``), empty without experts: the mixture stays one
    ``ffn`` component, so that the FFN's share of a model reads the same with or without experts."""

    total: int
    components: dict[str, int] = field(default_factory=dict)
    per_layer: dict[str, int] = field(default_factory=dict)
    active: int | None = None  # None: every parameter (no experts)
    ffn_parts: dict[str, int] = field(default_factory=dict)

    @property
    def active_per_token(self) -> int:
        """``active``, or the total when every parameter computes each token."""
        return self.total if self.active is None else self.active

    def to_dict(self) -> dict[str, object]:
        """``{"total": int, "components": {...}, "per_layer": {...}}`` (and ``"active"``, ``"ffn_parts"`` with
        experts)."""
        out = {"total": self.total, "components": dict(self.components), "per_layer": dict(self.per_layer)}
        experts = {"active": self.active, "ffn_parts": dict(self.ffn_parts)}
        return out if self.active is None else {**out, **experts}


def _norm(config: ModelConfig) -> int:
    return norm_parameter_count(config.d_model, config.norm, config.bias)


def ffn_parts(config: ModelConfig) -> dict[str, int]:
    """A mixture of experts' parameters in one block by part (router, experts, shared_expert); {} for a
    dense FFN."""
    c = config
    if not c.n_experts:
        return {}
    return moe_parameters(activation_kind(c.activation).ffn_kind, c.d_model, c.d_ff, c.has_ffn_bias,
                          c.n_experts, c.shared_expert_d_ff)


def block_parameter_counts(config: ModelConfig) -> dict[str, int]:
    """One block's parameters by submodule: attn, ffn (a mixture of experts whole: ``ffn_parts`` splits
    it), then each norm of its layout (ln1, ln2; sandwich adds ln1_out, ln2_out) and ``residual`` (rezero's
    learned scalar per connection); attn includes QK-norm's two norms."""
    c = config
    layout = LAYOUTS[c.norm_position]
    qk_norms = sum(norm_parameter_count(width, c.norm, c.bias)
                   for width in qk_norm_widths(c.qk_norm, c.d_head, c.n_heads, c.kv_heads))
    counts = {
        "attn": attention_parameter_count(c.d_model, c.bias, c.kv_heads * c.d_head, c.qkv_bias,
                                          c.n_heads * c.d_head, c.o_bias) + qk_norms,
    }
    parts = ffn_parts(c)
    counts["ffn"] = sum(parts.values()) if parts else ffn_parameter_count(c.d_model, c.d_ff, c.activation,
                                                                          c.has_ffn_bias)
    counts |= {norm: _norm(c) for norm in layout.norms}
    if c.residual == "rezero":
        counts["residual"] = len(layout.residuals)  # one learned scalar per residual connection
    return counts


def count_parameters(config: ModelConfig) -> ParamCount:
    """Every parameter of ``Transformer(config)``, counted from the shapes alone."""
    c = config
    per_layer = block_parameter_counts(c)
    components = {"embed": c.vocab_size * c.d_model}
    if POSITION_KINDS[c.pos_encoding].learned:
        components["pos"] = c.max_seq_len * c.d_model
    if c.type_vocab_size:
        components["token_type"] = c.type_vocab_size * c.d_model
    if c.embed_norm:
        components["embed_ln"] = _norm(c)
    for name, count in per_layer.items():
        components[f"blocks.{name}"] = count * c.n_layers
    if c.final_norm:
        components["ln_f"] = _norm(c)
    weights = 0 if c.tie_embeddings else c.vocab_size * c.d_model
    components["head"] = weights + (c.vocab_size if c.head_bias else 0)
    components = {k: v for k, v in components.items() if v or k == "head"}
    total = sum(components.values())
    parts = ffn_parts(c)
    # the experts a token skips: E - k of them in every layer
    idle = (c.n_experts - c.experts_per_token) * parts["experts"] // c.n_experts if parts else 0
    return ParamCount(total, components, per_layer | {"total": sum(per_layer.values())},
                      total - idle * c.n_layers if parts else None, parts)


def format_count(n: int) -> str:
    """124439808 -> '124.4M'."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
