"""Each per-position norm kind's kernel pair: a forward returning (out, mean, rstd) and its backward.

The LayerNorm backward is docs/concepts.md#layer-normalization:

    dL/dz = rstd * (gh - mean(gh) - z_hat * mean(gh * z_hat)),   gh = g * gamma
    dL/dgamma = sum of g * z_hat,   dL/dbeta = sum of g

``layer_norm_backward`` evaluates it with tensor ops. The kind that centres with eps inside the root
(LayerNorm) uses ATen's one-pass kernels instead (``native_layer_norm_backward``, tested equal to
``layer_norm_backward``), about 10x faster on CPU than eight separate tensor ops; RMSNorm uses the same
backward kernel given a zero mean, plus the one term it lacks. Which pair a kind gets follows from its
record (``centres``, ``eps_inside_root``), never from its name. kernels.py's autograd functions call them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor

from .norm_kinds import NORM_KINDS, NormKind, is_layer_norm, layer_norm_variants


def layer_norm_backward(
    g: Tensor, x: Tensor, mean: Tensor | None, rstd: Tensor, gamma: Tensor | None, k: Tensor | float = 1.0
) -> tuple[Tensor, Tensor | None, Tensor]:
    """docs/concepts.md#layer-normalization, written out: (dL/dx, dL/dgamma, dL/dbeta) for g = dL/dout.

    ``mean`` is None for RMSNorm, which does not centre (so the mean(gh) term drops).
    ``k`` scales the last term: 1, except eps_outside_sqrt, where z_hat = (x - mu) / (sigma + eps)
    and k = (sigma + eps) / sigma = 1 / (1 - eps * rstd).
    """
    z_hat = x * rstd if mean is None else (x - mean) * rstd
    gh = g if gamma is None else g * gamma
    dz = gh - z_hat * (k * (gh * z_hat).mean(-1, keepdim=True))
    if mean is not None:
        dz = dz - gh.mean(-1, keepdim=True)
    rows = tuple(range(g.dim() - 1))
    dgamma = (g * z_hat).sum(rows) if gamma is not None else None
    return rstd * dz, dgamma, g.sum(rows)


def _standard_forward(x: Tensor, gamma: Tensor | None, beta: Tensor | None, eps: float):
    return torch.native_layer_norm(x, x.shape[-1:], gamma, beta, eps)


def _standard_backward(g, x, mean, rstd, gamma, beta, eps):
    mask = [True, gamma is not None, beta is not None]
    return torch.ops.aten.native_layer_norm_backward(g, x, x.shape[-1:], mean, rstd, gamma, beta, mask)


def _rms_forward(x: Tensor, gamma: Tensor | None, beta: Tensor | None, eps: float):
    if x.device.type == "cuda":  # ATen's fused kernels, forward and backward, exist there
        out, rstd = torch.ops.aten._fused_rms_norm(x, x.shape[-1:], gamma, eps)
        return out, None, rstd
    # On CPU ATen's fused forward takes 1.5-3x LayerNorm's; one reduction (the row's norm, accumulated in
    # float32 at least) and two products cost about what LayerNorm's forward does. rstd is rounded to x's
    # dtype, as LayerNorm's kernel gives its statistics (16-bit products stay 16-bit: a float32 detour
    # costs 2-8x the norm on a CPU without native bfloat16).
    accumulate = torch.promote_types(x.dtype, torch.float32)
    sum_sq = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=accumulate).square_()  # (..., 1)
    rstd = sum_sq.div_(x.shape[-1]).add_(eps).rsqrt_().to(x.dtype)  # 1 / sqrt(mean(x^2) + eps)
    out = x * rstd
    return (out if gamma is None else out.mul_(gamma)), None, rstd


def _rms_backward(g, x, mean, rstd, gamma, beta, eps):
    if x.device.type == "cuda":
        dx, dgamma = torch.ops.aten._fused_rms_norm_backward(g, x, x.shape[-1:], rstd, gamma,
                                                             [True, gamma is not None])
        return dx, dgamma, None
    # ATen has no CPU RMSNorm backward, but LayerNorm's one-pass kernel given mean 0 computes
    # rstd * (gh - mean(gh) - z_hat * mean(gh * z_hat)) with z_hat = x * rstd: RMSNorm's dL/dx less its
    # mean(gh) term, which one matrix-vector product gives back (gh = g * gamma, so mean(gh) = g @ gamma / d).
    # dL/dgamma = sum of g * z_hat is the same. About 2.5x fewer passes than the eight tensor ops.
    # ATen's 16-bit kernel sums dL/dgamma over the rows in 16 bits (0.1 relative error over 30k rows): there
    # the products are summed in float32 instead.
    sixteen_bit = x.element_size() == 2
    mask, zero_mean = [True, gamma is not None and not sixteen_bit, False], torch.zeros_like(rstd)
    dx, dgamma, _ = torch.ops.aten.native_layer_norm_backward(g, x, x.shape[-1:], zero_mean, rstd, gamma,
                                                             None, mask)
    if gamma is not None and sixteen_bit:
        dgamma = (g * x).mul_(rstd).sum(tuple(range(g.dim() - 1)), dtype=torch.float32).to(gamma.dtype)
    sum_gh = (g @ gamma if gamma is not None else g.sum(-1)).unsqueeze(-1)  # (..., 1)
    return dx.add_(sum_gh.mul_(rstd).div_(x.shape[-1])), dgamma, None


def _eps_outside_forward(x: Tensor, gamma: Tensor | None, beta: Tensor | None, eps: float,
                         centres: bool = True):
    mean = x.mean(-1, keepdim=True) if centres else None  # None: the kind does not centre
    centred = x - mean if centres else x
    rstd = 1.0 / (centred.square().mean(-1, keepdim=True).sqrt() + eps)  # 1 / (sigma + eps)
    out = centred * rstd
    out = out if gamma is None else out * gamma
    return (out if beta is None else out + beta), mean, rstd


def _eps_outside_backward(g, x, mean, rstd, gamma, beta, eps):
    # sigma == 0 only for a constant row, where z_hat == 0: the clamp keeps 0 * k finite
    k = 1.0 / (1.0 - eps * rstd).clamp_min(torch.finfo(rstd.dtype).tiny)
    dx, dgamma, dbeta = layer_norm_backward(g, x, mean, rstd, gamma, k)
    return dx, dgamma, (dbeta if beta is not None else None)


class NormKernel(NamedTuple):
    """One LayerNorm variant: ``forward(x, gamma, beta, eps) -> (out, mean | None, rstd)`` and
    ``backward(g, x, mean, rstd, gamma, beta, eps) -> (dx, dgamma, dbeta)``."""

    variant: str
    eps: float
    forward: Callable
    backward: Callable

    def __call__(self, x: Tensor, gamma: Tensor | None, beta: Tensor | None) -> tuple:
        return self.forward(_norm_input(x, gamma), gamma, beta, self.eps)

    def grad(self, g: Tensor, x: Tensor, stats: tuple, gamma: Tensor | None, beta: Tensor | None) -> tuple:
        """(dx, dgamma, dbeta) given the (out, mean, rstd) this kernel returned for x."""
        return self.backward(g, _norm_input(x, gamma), stats[1], stats[2], gamma, beta, self.eps)


def _norm_input(x: Tensor, gamma: Tensor | None) -> Tensor:
    """x in the wider of its dtype and gamma's: a bfloat16 input under autocast (a sandwich norm after
    a matmul) is normalised in float32 with the float32 parameters, as autocast does for F.layer_norm
    on CUDA, and no kernel meets mixed dtypes. A no-op when the dtypes agree."""
    if gamma is None or gamma.dtype == x.dtype:
        return x
    return x.to(torch.promote_types(x.dtype, gamma.dtype))


# The forward/backward pair of every per-position norm kind, by what its record says:
# (centres, eps_inside_root) -> (forward, backward).
_NORM_PAIRS: dict[tuple[bool, bool], tuple[Callable, Callable]] = {
    (True, True): (_standard_forward, _standard_backward),
    (False, True): (_rms_forward, _rms_backward),
    (True, False): (_eps_outside_forward, _eps_outside_backward),
    (False, False): (partial(_eps_outside_forward, centres=False), _eps_outside_backward),
}


def norm_kernel(kind: NormKind | str, eps: float) -> NormKernel:
    """The forward/backward pair of a per-position norm kind (a record of norm_kinds.NORM_KINDS, or its
    name); the pair follows from the record: ATen's kernels where one computes it."""
    if isinstance(kind, str):
        if not is_layer_norm(kind):
            raise ValueError(f"LayerNorm variant={kind!r} is not one of: {', '.join(layer_norm_variants())}")
        kind = NORM_KINDS[kind]
    return NormKernel(kind.name, float(eps), *_NORM_PAIRS[kind.centres, kind.eps_inside_root])
