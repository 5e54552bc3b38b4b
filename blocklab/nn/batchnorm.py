"""BatchNorm over batch and positions (``ModelConfig.norm="batch"``), the foil to LayerNorm.

For each feature j, statistics are over every position of every sequence in the batch:

    mu_j = mean over (b, t) of x[b, t, j],   var_j = mean over (b, t) of (x[b, t, j] - mu_j)^2
    out = gamma * (x - mu) / sqrt(var + eps) + beta

In training the batch statistics are used and running estimates are updated
(``running = (1 - momentum) * running + momentum * batch``, the running variance unbiased,
as ``nn.BatchNorm1d`` does); in eval the running estimates are used. So a sequence's output
depends on the rest of its batch and on train/eval mode, which is the point of comparing it
with LayerNorm. Padded positions (``padding_mask``, True at padding; the block passes the batch's
key padding mask) are left out of the statistics.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class BatchNorm(nn.Module):
    """Keys: ``weight`` (gamma), ``bias`` (beta); buffers ``running_mean``, ``running_var``."""

    STAGES: tuple[str, ...] = ()  # no stages of its own (its statistics are the batch's)

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        bias: bool = True,
        momentum: float = 0.1,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not eps > 0:
            raise ValueError(f"BatchNorm eps={eps!r} must be > 0")
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.eps, self.momentum = d_model, float(eps), momentum
        self.weight = nn.Parameter(torch.ones(d_model, **factory))
        self.bias = nn.Parameter(torch.zeros(d_model, **factory)) if bias else None
        self.register_buffer("running_mean", torch.zeros(d_model, **factory))
        self.register_buffer("running_var", torch.ones(d_model, **factory))

    def _rows(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """The (N, d) vectors the statistics are taken over: every non-padded position."""
        flat = x.reshape(-1, self.d_model)
        if padding_mask is None:
            return flat
        if padding_mask.shape != x.shape[:-1]:
            raise ValueError(f"BatchNorm padding_mask has shape {tuple(padding_mask.shape)}; "
                             f"the input's positions are {tuple(x.shape[:-1])}")
        return flat[~padding_mask.reshape(-1)]

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:  # (..., d_model)
        """``padding_mask``: bool (B, T), True at padding (left out of the batch statistics)."""
        if self.training:
            rows = self._rows(x, padding_mask)
            mean, var = rows.mean(0), rows.var(0, unbiased=False)  # (d,) each
            n = rows.shape[0]
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
                unbiased = var.detach() * (n / (n - 1)) if n > 1 else var.detach()
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        out = (x - mean) * torch.rsqrt(var + self.eps) * self.weight
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, momentum={self.momentum}, bias={self.bias is not None}"
