"""The position-wise feed-forward network (docs/concepts.md#feed-forward-network).

    FFN(x) = act(x @ W1.T + b1) @ W2.T + b2        W1: (d_ff, d), W2: (d, d_ff)

An activation whose FFN kind is gated (ffn_kinds.py; swiglu, geglu) adds W3: (d_ff, d) and computes
``gate(x @ W1.T + b1) * (x @ W3.T + b3) @ W2.T + b2``. The same weights apply to every
position independently.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .activation_kinds import activation_kind
from .circuits import FeedForwardWeights
from .hooks import HookPoint
from .kernels import act_kernel, act_linear, norm_linear
from .packed import packed_linear, packing


class FeedForward(FeedForwardWeights, nn.Module):
    """Keys: ``w1.weight (d_ff, d_model)``, ``w1.bias``, ``w2.weight (d_model, d_ff)``, ``w2.bias``,
    and for gated activations ``w3.weight (d_ff, d_model)``, ``w3.bias``.

    Stages, in forward order (``stages``): ``hidden`` (pre-activation x W1^T + b1; gated: the gate's),
    when gated ``linear`` (the linear branch x W3^T + b3, TransformerLens' ``hook_pre_linear``),
    ``act`` (what enters W2), ``out``.
    """


    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        bias: bool = True,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fused: bool = True,
    ) -> None:
        super().__init__()
        if d_ff < 1:
            raise ValueError(f"FeedForward d_ff={d_ff} must be >= 1")
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.act_kernel = act_kernel(activation)  # act(h) (gated: gate(h1) * h3) and its derivative
        kind = activation_kind(activation).ffn_kind  # its matrices and stages (ffn_kinds.py)
        self.w1 = nn.Linear(d_model, d_ff, bias=bias, **factory)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias, **factory)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias, **factory) if kind.gated else None
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.stages = kind.stages
        for stage in self.stages:
            setattr(self, f"hook_{stage}", HookPoint())
        self.fused = fused  # the lean path keeps h only, not act(h) (blocklab/nn/kernels.py)

    def in_weights(self) -> tuple[Tensor, ...]:
        """W1 (and W3 when gated): x @ cat(W1, W3).T + cat(b1, b3) is h = [h1 | h3] in one matmul."""
        return (self.w1.weight,) if self.w3 is None else (self.w1.weight, self.w3.weight)

    def in_bias(self) -> Tensor | None:
        """b1 (and b3), matching ``in_weights``."""
        if self.w1.bias is None:
            return None
        return self.w1.bias if self.w3 is None else torch.cat([self.w1.bias, self.w3.bias])

    def project_in(self, x: Tensor) -> tuple[Tensor, ...]:  # (B, T, d) -> (h,) or (h1, h3): (B, T, d_ff)
        """The pre-activations: one matmul over cat(W1, W3) when fused and autograd records (keeping x, not
        the concat, for backward); without autograd (inference, generation) one matmul per matrix, which
        costs no concatenation of the weights on every call (issue 38: 1.45 s of 8.7 s of a generation)."""
        if self.fused and torch.is_grad_enabled():
            return norm_linear(x, None, None, None, self.in_weights(), self.in_bias())
        inputs = (self.w1,) if self.w3 is None else (self.w1, self.w3)
        if packing(x, *inputs):  # one token of one sequence: one GEMV over the packed [W1 | W3]
            h = packed_linear(self, "in", x, self.in_weights(), [m.bias for m in inputs])
            return h.split(self.d_ff, dim=-1)
        return (self.w1(x),) if self.w3 is None else (self.w1(x), self.w3(x))

    def gate(self, h1: Tensor) -> Tensor:  # (B, T, d_ff)
        """gate(h1) of a gated activation, the factor act = gate(h1) * h3 multiplies: the kernel's own
        gate function (the tracer shows it, as no stage holds it)."""
        if self.act_kernel.gate is None:
            raise ValueError(f"activation={self.activation!r} is not gated: it has no gate")
        return self.act_kernel.gate(h1)

    @property
    def gate_name(self) -> str:
        """The gate function's name (silu, gelu), "" for an ungated activation."""
        return self.act_kernel.gate.__name__ if self.act_kernel.gate is not None else ""

    def from_hidden(self, *h: Tensor) -> Tensor:  # h, or gated h1, h3: (B, T, d_ff) each -> (B, T, d_model)
        """act(h) @ W2.T + b2 keeping only h for backward (the lean path): observers see ``hidden`` and
        ``act`` (computed beside it), never a different computation."""
        self.hook_hidden.see(h[0])
        if len(h) > 1:
            self.hook_linear.see(h[1])
        self.hook_act.observe(lambda: self.act_kernel.forward(*h))
        return self.hook_out(self.dropout(act_linear(h, self.act_kernel, self.w2.weight, self.w2.bias)))

    def forward(self, x: Tensor) -> Tensor:  # (B, T, d_model)
        h = self.project_in(x)
        if self.fused and not any(getattr(self, f"hook_{s}").intervened for s in self.stages[:-1]):
            return self.from_hidden(*h)
        # module by module, each stage a tensor an intervention may replace; same forward values
        h = (self.hook_hidden(h[0]), *(self.hook_linear(h3) for h3 in h[1:]))  # (B, T, d_ff) each
        a = self.hook_act(self.act_kernel.forward(*h))  # (B, T, d_ff)
        return self.hook_out(self.dropout(self.w2(a)))  # (B, T, d_model)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}"


def ffn_parameter_count(d_model: int, d_ff: int, activation: str, bias: bool) -> int:
    """2 d d_ff + d_ff + d for the dense FFN (3 d d_ff + 2 d_ff + d when gated): its FFN kind's count."""
    return activation_kind(activation).ffn_kind.parameters(d_model, d_ff, bias)
