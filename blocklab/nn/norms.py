"""Layer normalization (docs/concepts.md#layer-normalization): standard, eps-outside-sqrt and RMS variants.

For each position's vector z of size d, statistics are over the feature dimension only:

    mu = mean(z),  var = mean((z - mu)^2)  (biased),  z_hat = (z - mu) / sqrt(var + eps)
    out = gamma * z_hat + beta

``layer_norm_stats`` exposes the numbers the tracer shows (mu, var, the denominator, z_hat);
``LayerNorm.forward`` uses PyTorch's fused kernels where the variant has one.

Every norm a config builds (``build_norm``) takes ``norm(x, padding_mask)``: LayerNorm normalises
each position on its own and has no use for the mask; BatchNorm leaves padded positions out of
its statistics; ``NoNorm`` ("none") returns x.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .batchnorm import BatchNorm
from .hooks import HookPoint
from .kernels import LAYER_NORM_VARIANTS, NormKernel, layer_norm, norm_kernel

NORM_VARIANTS = LAYER_NORM_VARIANTS  # the kernels' table is the one list of LayerNorm variants
# each variant's name in words (the tracer's labels and sentences)
NORM_KIND_NAMES = {"standard": "LayerNorm", "rms": "RMSNorm",
                   "eps_outside_sqrt": "LayerNorm (eps outside the root)"}


@dataclass(frozen=True)
class NormStats:
    """What a LayerNorm computed for each position: shapes (..., 1) except z_hat (..., d)."""

    mu: Tensor  # zero for RMSNorm, which does not centre
    var: Tensor  # for RMSNorm: mean(z^2)
    denom: Tensor  # sqrt(var + eps), or sqrt(var) + eps for eps_outside_sqrt
    z_hat: Tensor  # the normalized vector before gamma/beta


def layer_norm_stats(z: Tensor, eps: float, variant: str = "standard") -> NormStats:
    """The explicit per-position statistics of a LayerNorm variant (float math, no fused kernel)."""
    if variant == "rms":
        mu = torch.zeros_like(z[..., :1])
        var = z.pow(2).mean(-1, keepdim=True)
        denom = torch.sqrt(var + eps)
        return NormStats(mu, var, denom, z / denom)
    mu = z.mean(-1, keepdim=True)
    centred = z - mu
    var = centred.pow(2).mean(-1, keepdim=True)  # biased: divide by d, not d-1
    denom = torch.sqrt(var) + eps if variant == "eps_outside_sqrt" else torch.sqrt(var + eps)
    return NormStats(mu, var, denom, centred / denom)


def _standard(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _eps_outside_sqrt(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    out = layer_norm_stats(x, eps, "eps_outside_sqrt").z_hat
    if weight is not None:
        out = out * weight
    return out + bias if bias is not None else out


def _rms(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    return F.rms_norm(x, x.shape[-1:], weight, eps)


_NORM_FUNCTIONS = {"standard": _standard, "eps_outside_sqrt": _eps_outside_sqrt, "rms": _rms}


def _lean(kernel: NormKernel, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    return layer_norm(x, kernel, weight, bias)  # saves x only (blocklab/nn/kernels.py)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension; keys ``weight`` (gamma) and ``bias`` (beta).

    ``variant``: "standard", "eps_outside_sqrt" or "rms" (RMSNorm: gamma only, never a bias).
    ``bias=False`` gives the bias-free LayerNorm (gamma only). Stage ``scale`` (..., 1): the
    denominator each position was divided by (TransformerLens' ``hook_scale``); an intervention on it
    replaces the denominator (freezing a norm's scale), the norm then computed explicitly.
    """

    STAGES = ("scale",)

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        variant: str = "standard",
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fused: bool = True,
    ) -> None:
        super().__init__()
        if variant not in _NORM_FUNCTIONS:
            raise ValueError(f"LayerNorm variant={variant!r} is not one of: {', '.join(NORM_VARIANTS)}")
        if not eps > 0:
            raise ValueError(f"LayerNorm eps={eps!r} must be > 0")
        self.d_model, self.eps, self.variant = d_model, float(eps), variant
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(d_model, **factory))
        has_bias = bias and variant != "rms"
        self.bias = nn.Parameter(torch.zeros(d_model, **factory)) if has_bias else None
        self._fn = _NORM_FUNCTIONS[variant]
        self.kernel = norm_kernel(variant, self.eps)  # forward + backward pair of the fused paths
        if fused and variant != "standard":  # F.layer_norm already saves only x, mean and rstd
            self._fn = partial(_lean, self.kernel)
        self.hook_scale = HookPoint()

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:  # (..., d_model)
        """``padding_mask`` is accepted and unused: each position is normalised on its own."""
        if self.hook_scale.intervened:  # the denominator replaced: (x - mu) / scale, then gamma, beta
            stats = self.stats(x)
            out = (x - stats.mu) / self.hook_scale(stats.denom) * self.weight
            return out + self.bias if self.bias is not None else out
        self.hook_scale.observe(lambda: self.stats(x).denom)
        return self.normalize(x)

    def normalize(self, x: Tensor) -> Tensor:
        """The norm's output, without its hook point (for a path that shows the scale itself)."""
        return self._fn(x, self.weight, self.bias, self.eps)

    def stats(self, x: Tensor) -> NormStats:
        """mu, var, denominator and z_hat this norm computes for input ``x``."""
        return layer_norm_stats(x, self.eps, self.variant)

    def share(self, part: Tensor, whole: Tensor) -> Tensor:  # part (..., B, T, d), whole (B, T, d)
        """What ``part``, one summand of the input ``whole``, contributes to the output:
        gamma (part - mean(part)) / denom(whole) (RMSNorm does not centre), without beta. The norm is
        linear in its input once the denominator is held at the one it computed for ``whole``, so
        the shares of all the summands, plus beta, are its output (the activation cache's
        ``apply_ln_to_stack``)."""
        centred = part if self.variant == "rms" else part - part.mean(-1, keepdim=True)
        return centred / self.stats(whole).denom * self.weight

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, variant={self.variant!r}, bias={self.bias is not None}"


def norm_parameter_count(d_model: int, variant: str, bias: bool) -> int:
    """Parameters of one LayerNorm: 2d (gamma + beta), d without bias or for RMSNorm."""
    return d_model * (2 if bias and variant != "rms" else 1)


class NoNorm(nn.Module):
    """norm="none": the identity, with the norms' signature."""

    STAGES: tuple[str, ...] = ()

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return x

    def share(self, part: Tensor, whole: Tensor) -> Tensor:
        """What ``part`` of the input contributes to the output: itself (``LayerNorm.share``)."""
        return part


def build_norm(
    norm: str, d_model: int, eps: float, bias: bool, device=None, dtype=None, fused: bool = True
) -> nn.Module:
    """The norm a config names: a LayerNorm variant, BatchNorm, or ``NoNorm`` for "none"."""
    if norm == "none":
        return NoNorm()
    if norm == "batch":  # BatchNorm over batch and positions (the LayerNorm-vs-BatchNorm claim)
        return BatchNorm(d_model, eps=eps, bias=bias, device=device, dtype=dtype)
    return LayerNorm(d_model, eps=eps, variant=norm, bias=bias, device=device, dtype=dtype, fused=fused)
