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


@dataclass(frozen=True)
class ParamCount:
    """``total`` and its breakdown: ``components`` sum to the total; ``per_layer`` is one block.
    ``active``: the parameters one token is computed with (a mixture of experts uses k of its E experts;
    otherwise the total)."""

    total: int
    components: dict[str, int] = field(default_factory=dict)
    per_layer: dict[str, int] = field(default_factory=dict)
    active: int | None = None  # None: every parameter (no experts)

    @property
    def active_per_token(self) -> int:
        """``active``, or the total when every parameter computes each token."""
        return self.total if self.active is None else self.active

    def to_dict(self) -> dict[str, object]:
        """``{"total": int, "components": {...}, "per_layer": {...}}`` (and ``"active"`` with experts)."""
        out = {"total": self.total, "components": dict(self.components), "per_layer": dict(self.per_layer)}
        return out if self.active is None else {**out, "active": self.active}


def _norm(config: ModelConfig) -> int:
    return norm_parameter_count(config.d_model, config.norm, config.bias)


def block_parameter_counts(config: ModelConfig) -> dict[str, int]:
    """One block's parameters by submodule: attn, ffn (a mixture of experts: router, experts and
    shared_expert in its place), then each norm of its layout (ln1, ln2; sandwich adds ln1_out, ln2_out)
    and ``residual`` (rezero's learned scalar per connection); attn includes QK-norm's two norms."""
    c = config
    layout = LAYOUTS[c.norm_position]
    qk_norms = sum(norm_parameter_count(width, c.norm, c.bias)
                   for width in qk_norm_widths(c.qk_norm, c.d_head, c.n_heads, c.kv_heads))
    counts = {
        "attn": attention_parameter_count(c.d_model, c.bias, c.kv_heads * c.d_head, c.qkv_bias,
                                          c.n_heads * c.d_head, c.o_bias) + qk_norms,
    }
    if c.n_experts:
        counts |= moe_parameters(activation_kind(c.activation).ffn_kind, c.d_model, c.d_ff, c.bias,
                                 c.n_experts, c.shared_expert_d_ff)
    else:
        counts["ffn"] = ffn_parameter_count(c.d_model, c.d_ff, c.activation, c.bias)
    counts |= {norm: _norm(c) for norm in layout.norms}
    if c.residual == "rezero":
        counts["residual"] = len(layout.residuals)  # one learned scalar per residual connection
    return counts


def count_parameters(config: ModelConfig) -> ParamCount:
    """Every parameter of ``Transformer(config)``, counted from the shapes alone."""
    c = config
    per_layer = block_parameter_counts(c)
    components = {"embed": c.vocab_size * c.d_model}
    if c.pos_encoding == "learned":
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
    # the experts a token skips: E - k of them in every layer
    idle = (c.n_experts - c.experts_per_token) * per_layer["experts"] // c.n_experts if c.n_experts else 0
    return ParamCount(total, components, per_layer | {"total": sum(per_layer.values())},
                      total - idle * c.n_layers if c.n_experts else None)


def format_count(n: int) -> str:
    """124439808 -> '124.4M'."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
