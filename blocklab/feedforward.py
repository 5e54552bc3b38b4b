"""The position-wise feed-forward network (SPEC section 3).

    FFN(x) = act(x @ W1.T + b1) @ W2.T + b2        W1: (d_ff, d), W2: (d, d_ff)

Gated variants (swiglu, geglu) add W3: (d_ff, d) and compute
``gate(x @ W1.T + b1) * (x @ W3.T + b3) @ W2.T + b2``. The same weights apply to every
position independently.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .activations import GATED_ACTIVATIONS, get_activation, is_gated
from .hooks import HookPoint


class FeedForward(nn.Module):
    """Keys: ``w1.weight (d_ff, d_model)``, ``w1.bias``, ``w2.weight (d_model, d_ff)``, ``w2.bias``,
    and for gated activations ``w3.weight (d_ff, d_model)``, ``w3.bias``.

    Stages: ``hidden`` (pre-activation x W1^T + b1), ``act`` (what enters W2), ``out``.
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
    ) -> None:
        super().__init__()
        if d_ff < 1:
            raise ValueError(f"FeedForward d_ff={d_ff} must be >= 1")
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.act = get_activation(activation)
        self.w1 = nn.Linear(d_model, d_ff, bias=bias, **factory)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias, **factory)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias, **factory) if is_gated(activation) else None
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.hook_hidden = HookPoint()
        self.hook_act = HookPoint()
        self.hook_out = HookPoint()
        self._activate = self._gated if activation in GATED_ACTIVATIONS else self._plain

    def _plain(self, x: Tensor, h: Tensor) -> Tensor:
        return self.act(h)

    def _gated(self, x: Tensor, h: Tensor) -> Tensor:
        return self.act(h) * self.w3(x)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, d_model)
        h = self.hook_hidden(self.w1(x))  # (B, T, d_ff)
        a = self.hook_act(self._activate(x, h))  # (B, T, d_ff)
        return self.hook_out(self.dropout(self.w2(a)))  # (B, T, d_model)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}"


def ffn_parameter_count(d_model: int, d_ff: int, activation: str, bias: bool) -> int:
    """2 d d_ff + d_ff + d for the classic FFN (3 d d_ff + 2 d_ff + d when gated)."""
    n_in = 2 if is_gated(activation) else 1  # matrices reading d_model: w1 (and w3)
    return n_in * (d_model * d_ff + (d_ff if bias else 0)) + d_ff * d_model + (d_model if bias else 0)
