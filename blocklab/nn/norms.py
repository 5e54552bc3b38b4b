"""Layer normalization (docs/concepts.md#layer-normalization): every per-position norm kind, as its record
(norm_kinds.NORM_KINDS) defines it.

For each position's vector z of size d, statistics are over the feature dimension only:

    mu = mean(z),  var = mean((z - mu)^2)  (biased),  z_hat = (z - mu) / sqrt(var + eps)
    out = gamma * z_hat + beta

``layer_norm_stats`` exposes the numbers the tracer shows (mu, var, the denominator, z_hat);
``LayerNorm.forward`` uses PyTorch's fused kernels where one computes the kind (it centres, or not,
with eps inside the root), else the lean pair of kernels.py. Nothing here tests a kind's name: the
record says whether it centres, where eps goes, whether it has gamma (and its offset) and beta.

Every norm a config builds (``build_norm``) takes ``norm(x, padding_mask)``: LayerNorm normalises
each position on its own and has no use for the mask; BatchNorm leaves padded positions out of
its statistics; ``NoNorm`` ("none") returns x.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .batchnorm import BatchNorm
from .hooks import HookPoint
from .kernels import layer_norm
from .norm_kernels import NormKernel, norm_kernel
from .norm_kinds import NORM_KINDS, NormKind, layer_norm_variants

NORM_VARIANTS = layer_norm_variants()  # the per-position kinds the package ships


@dataclass(frozen=True)
class NormStats:
    """What a LayerNorm computed for each position: shapes (..., 1) except z_hat (..., d)."""

    mu: Tensor  # zero for a kind that does not centre (RMSNorm)
    var: Tensor  # for a kind that does not centre: mean(z^2)
    denom: Tensor  # sqrt(var + eps), or sqrt(var) + eps for a kind with eps outside the root
    z_hat: Tensor  # the normalized vector before gamma/beta


def norm_kind(variant: str | NormKind) -> NormKind:
    """The per-position norm kind a name (or a record) stands for; ValueError naming the known ones."""
    kind = NORM_KINDS.get(variant) if isinstance(variant, str) else variant
    if kind is None or not kind.per_position:
        raise ValueError(f"LayerNorm variant={variant!r} is not one of: {', '.join(layer_norm_variants())}")
    return kind


def layer_norm_stats(z: Tensor, eps: float, variant: str | NormKind = "standard") -> NormStats:
    """The explicit per-position statistics of a norm kind (float math, no fused kernel)."""
    # a name that is no per-position kind (BatchNorm's, whose input the diagnostics describe per position)
    # gets the first kind's statistics: the mean and variance of each position
    kind = NORM_KINDS.get(variant) if isinstance(variant, str) else variant
    kind = kind if kind is not None and kind.per_position else NORM_KINDS[layer_norm_variants()[0]]
    mu = z.mean(-1, keepdim=True) if kind.centres else torch.zeros_like(z[..., :1])
    centred = z - mu if kind.centres else z
    var = centred.pow(2).mean(-1, keepdim=True)  # biased: divide by d, not d-1
    denom = torch.sqrt(var + eps) if kind.eps_inside_root else torch.sqrt(var) + eps
    return NormStats(mu, var, denom, centred / denom)


def _aten_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _explicit(kind: NormKind, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    out = layer_norm_stats(x, eps, kind).z_hat
    if weight is not None:
        out = out * weight
    return out + bias if bias is not None else out


def _module_path(kind: NormKind, fused: bool, kernel: NormKernel) -> Callable:
    """The forward the module runs for ``kind``: ATen's kernel where one computes it forward and backward
    (LayerNorm's, saving x, mean and rstd), else the kind's kernel pair saving the same (the lean path's,
    also the module path's where the kind's root holds eps: ATen's RMSNorm backward is 3-9x LayerNorm's on
    CPU), or the explicit math."""
    if kind.centres and kind.eps_inside_root:
        return _aten_layer_norm
    if fused or kind.eps_inside_root:
        return partial(_kernel_pair, kernel)
    return partial(_explicit, kind)


def _kernel_pair(kernel: NormKernel, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                 eps: float) -> Tensor:
    if not torch.is_grad_enabled():  # nothing is saved for a backward: the forward kernel alone (decoding)
        return kernel(x, weight, bias)[0]
    return layer_norm(x, kernel, weight, bias)  # saves x, mean and rstd (blocklab/nn/kernels.py)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension; keys ``weight`` (gamma, less the kind's ``scale_offset``) and
    ``bias`` (beta).

    ``variant``: a per-position kind of norm_kinds.NORM_KINDS, by name or record (RMSNorm: gamma only,
    never a bias). ``bias=False`` gives the bias-free LayerNorm (gamma only). Stage ``scale`` (..., 1): the
    denominator each position was divided by (TransformerLens' ``hook_scale``); stage ``normalized``
    (..., d): the normalised vector before gamma and beta (TransformerLens' ``hook_normalized``). An
    intervention on either replaces it (freezing a norm's scale, patching the normalised vector), the norm
    then computed explicitly.
    """

    STAGES = ("scale", "normalized")

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        variant: str | NormKind = "standard",
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fused: bool = True,
    ) -> None:
        super().__init__()
        kind = norm_kind(variant)
        if not eps > 0:
            raise ValueError(f"LayerNorm eps={eps!r} must be > 0")
        self.d_model, self.eps, self.kind, self.variant = d_model, float(eps), kind, kind.name
        factory = {"device": device, "dtype": dtype}
        # gamma = scale_offset + weight starts at 1 (Gemma's weight at 0)
        start = torch.full((d_model,), 1.0 - kind.scale_offset, **factory) if kind.scale else None
        self.weight = nn.Parameter(start) if start is not None else None
        self.bias = nn.Parameter(torch.zeros(d_model, **factory)) if kind.has_bias(bias) else None
        self.kernel = norm_kernel(kind, self.eps)  # forward + backward pair of the fused paths
        self._fn = _module_path(kind, fused, self.kernel)
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    @property
    def gamma(self) -> Tensor | None:
        """The scale the normalised vector is multiplied by: ``scale_offset + weight`` (None: no gamma)."""
        if self.weight is None or not self.kind.scale_offset:
            return self.weight
        return self.weight + self.kind.scale_offset

    @property
    def w(self) -> Tensor:
        """gamma, as TransformerLens names it (``model.blocks[0].ln1.w``)."""
        if self.gamma is None:
            raise AttributeError(f"w: this {self.kind.name} norm has no gamma")
        return self.gamma

    @property
    def b(self) -> Tensor:
        """beta, as TransformerLens names it (``model.blocks[0].ln1.b``); RMSNorm has none, as there."""
        if self.bias is None:
            raise AttributeError(f"b: this {self.kind.name} norm has no beta")
        return self.bias

    @torch.no_grad()
    def set_identity_affine_(self) -> None:
        """gamma = 1, beta = 0 (after ``fold_ln`` moved them into the layers that read the norm)."""
        if self.weight is not None:
            self.weight.fill_(1.0 - self.kind.scale_offset)
        if self.bias is not None:
            self.bias.zero_()

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:  # (..., d_model)
        """``padding_mask`` is accepted and unused: each position is normalised on its own."""
        if self.hook_scale.intervened or self.hook_normalized.intervened:
            # computed explicitly, each stage through its hook: (x - mu) / scale, then gamma, beta
            stats = self.stats(x)
            out = self.hook_normalized((x - stats.mu) / self.hook_scale(stats.denom))  # (..., d)
            out = out * self.gamma if self.weight is not None else out
            return out + self.bias if self.bias is not None else out
        self.observe_stages(x)
        return self.normalize(x)

    def observe_stages(self, x: Tensor) -> None:
        """Show the observers of ``scale`` and ``normalized`` what this norm computes for input ``x``, for a
        path that runs the norm inside a fused kernel."""
        self.hook_scale.observe(lambda: self.stats(x).denom)
        self.hook_normalized.observe(lambda: self.stats(x).z_hat)

    def normalize(self, x: Tensor) -> Tensor:
        """The norm's output, without its hook point (for a path that shows the scale itself)."""
        return self._fn(x, self.gamma, self.bias, self.eps)

    def stats(self, x: Tensor) -> NormStats:
        """mu, var, denominator and z_hat this norm computes for input ``x``."""
        return layer_norm_stats(x, self.eps, self.kind)

    def share(self, part: Tensor, whole: Tensor) -> Tensor:  # part (..., B, T, d), whole (B, T, d)
        """What ``part``, one summand of the input ``whole``, contributes to the output:
        gamma (part - mean(part)) / denom(whole) (a kind that does not centre: part), without beta. The
        norm is linear in its input once the denominator is held at the one it computed for ``whole``, so
        the shares of all the summands, plus beta, are its output (the activation cache's
        ``apply_ln_to_stack``)."""
        centred = part - part.mean(-1, keepdim=True) if self.kind.centres else part
        share = centred / self.stats(whole).denom
        return share * self.gamma if self.weight is not None else share

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, variant={self.variant!r}, bias={self.bias is not None}"


def norm_parameter_count(d_model: int, variant: str, bias: bool) -> int:
    """Parameters of one norm of kind ``variant``: 2d (gamma + beta), d without bias or for RMSNorm
    (the record's ``parameters``)."""
    return NORM_KINDS[variant].parameters(d_model, bias)


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
    """The norm a config names, by its kind's statistics: a LayerNorm kind (per position), BatchNorm
    (over batch and positions: the LayerNorm-vs-BatchNorm claim), or ``NoNorm`` (none)."""
    kind = NORM_KINDS[norm]
    if not kind.normalises:
        return NoNorm()
    if not kind.per_position:
        return BatchNorm(d_model, eps=eps, bias=kind.has_bias(bias), device=device, dtype=dtype)
    return LayerNorm(d_model, eps=eps, variant=kind, bias=bias, device=device, dtype=dtype, fused=fused)
