"""Memory-lean autograd for the block: functions that save their inputs and recompute the rest.

Kernels only: tensors and weights in, tensors out. They know no modules; ``block.py`` wires
them into a block (its "lean" path), next to the module-by-module path that computes the same
forward values bit for bit.

Autograd keeps, for every op, the tensors its backward needs. A plain pre-norm block keeps LN1's
input *and* output, the FFN's pre-activation *and* activation, ...: about 17 d_model floats per
token. The functions here save only what is costly to recompute and recompute the rest in backward:

    NormLinear          h = LN(x) @ W.T + b                     saves x            (not LN(x))
    ResidualNormLinear  s = alpha x + (c @ Wo.T + bo)           saves x, c         (not s, LN(s))
                        z = LN(s),  h = z @ W.T + b             keep_sum: saves s, c (not x)
    ActLinear           act(h) @ W.T + b                        saves h            (not act(h))
    NormFunction        LN(x)                                   saves x, mean, rstd (a float per row each)

Where LN(x) feeds a matmul, the statistics (mean, rstd) are not saved either: the backward re-runs the
norm's forward kernel on the saved input, which yields LN(x), mean and rstd in one pass (a norm alone,
NormFunction, keeps its statistics: its backward does not need LN(x)). The bias b1 before the
activation is added by the matmul itself (addmm), so "bias + activation" costs no extra pass and
the activation, fused into the next linear, never stores its output.

What the fused pre-norm block saves per token (d = d_model, H heads, d_ff = 4d):

    x           d     the block input (LN1 and the residual are recomputed from it)
    q, k, v     3d    SDPA's inputs: views of one qkv tensor
    out         d     SDPA's output; the head concat c is a view of it (o's input)
    lse         H     SDPA's log-sum-exp
    h           4d    the FFN pre-activation: act(h) and act'(h) are recomputed from it
    total       9d + H   (the unfused block: 16.8d; `blocklab bench` measures both)

The residual stream y = x + c @ Wo.T + bo and LN2(y) are recomputed in backward from x and c,
which the block keeps anyway: one extra (d x d) matmul per token buys d floats per token.
The speed mode (``ModelConfig.keep_residual``, ``keep_sum=True`` here) keeps y instead: d floats
per token more (10d + H for the pre-norm block), that matmul less in backward.

    speed mode  s     d     the residual sum y (x is not needed: dL/dx = alpha dL/dy)
                total 10d + H

Backward passes are written out below; each norm kind's forward/backward pair is in norm_kernels.py.
Activation derivatives use ATen's kernels where they exist (the ones autograd itself uses for F.gelu,
F.relu, F.silu).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .activations import activation_kind, implementation
from .norm_kernels import NormKernel

# ---- mixed precision: backward runs as forward ran ------------------------------------------------
# Under torch.autocast the forward's matmuls run in bfloat16/float16 while the parameters, the
# residual stream and the norms stay float32. Autograd runs a function's backward outside autocast,
# so each function below records the autocast state its forward ran under and re-enters it in
# backward (torch.amp.custom_fwd/custom_bwd do this for one device type; these functions serve any),
# so recomputations (LN(x), act(h), the residual sum) repeat the forward bit for bit. In-place and
# out= matmuls, which autocast does not cast, cast their operands to the gradient's dtype: a no-op
# without autocast.


def autocast_state(x: Tensor) -> torch.dtype | None:
    """The dtype autocast runs matmuls in on x's device now, or None when autocast is off there."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def _as_forward_ran(ctx, x: Tensor) -> contextlib.AbstractContextManager:
    """Backward's context: autocast as ``autocast_state`` found it in forward (saved on ``ctx``)."""
    dtype = ctx.autocast
    return contextlib.nullcontext() if dtype is None else torch.autocast(x.device.type, dtype=dtype)


# ---- activation kernels: act(h) and the backward dL/dh = dL/da * act'(h) ------------------------


class ActKernel(NamedTuple):
    """``forward(*h) -> a`` and ``backward(g, *saved) -> (dL/dh, ...)``: h is (h,), or (h1, h3) for
    gated activations; ``saved`` is h, or (a,) when ``saves_output`` (ReLU: a > 0 exactly where
    h > 0, and a is what W2's gradient needs).

    ``backward`` may write over g (a temporary of the backward pass): one (N, d_ff) tensor less at
    the FFN backward, which is where a block's backward peaks.
    """

    name: str
    forward: Callable[..., Tensor]
    backward: Callable[..., tuple[Tensor, ...]]
    saves_output: bool = False
    gate: Callable[[Tensor], Tensor] | None = None  # gated: the gate function of gate(h1) * h3


def _gated(name: str, gate: Callable[[Tensor], Tensor], gate_backward: Callable) -> ActKernel:
    """a = gate(h1) * h3, h1 = w1's output, h3 = w3's."""

    def backward(g: Tensor, h1: Tensor, h3: Tensor) -> tuple[Tensor, Tensor]:
        dh3 = g * gate(h1)  # dL/dh3 = g gate(h1)
        return gate_backward(g.mul_(h3), h1), dh3  # dL/dh1 = g h3 gate'(h1), over g

    return ActKernel(name, lambda h1, h3: gate(h1) * h3, backward, gate=gate)


def act_kernel(activation: str) -> ActKernel:
    """The forward/backward pair of an FFN activation, from its record (activation_kinds.ACTIVATION_KINDS)
    and its FFN kind's (ffn_kinds.FFN_KINDS: act(h), or gate(h1) * h3)."""
    kind = activation_kind(activation)  # raises the usual error for an unknown name
    function, derivative = implementation(kind)
    if kind.ffn_kind.gated:
        return _gated(kind.name, function, derivative)
    return ActKernel(kind.name, function, lambda g, h: (derivative(g, h),), kind.saves_output)


# ---- linear backward shared by the functions ----------------------------------------------------


def _weight_grads(g: Tensor, inp: Tensor, with_bias: bool) -> tuple[Tensor, Tensor | None]:
    """For out = inp @ W.T + b: (dL/dW, dL/db) given g = dL/dout. (dL/dinp = g @ W.)"""
    g2, inp2 = g.reshape(-1, g.shape[-1]), inp.reshape(-1, inp.shape[-1])
    return g2.t() @ inp2, (g2.sum(0) if with_bias else None)


def _concat(weights: Sequence[Tensor]) -> Tensor:
    return weights[0] if len(weights) == 1 else torch.cat(list(weights))


def _linear_forward(z: Tensor, weights: Sequence[Tensor], bias: Tensor | None) -> tuple[Tensor, ...]:
    """(z @ W_1.T + b_1, ..., z @ W_k.T + b_k): one matmul over the concatenated weights, the
    outputs views of its result."""
    return F.linear(z, _concat(weights), bias).split([w.shape[0] for w in weights], dim=-1)


def _linear_backward(
    grads: Sequence[Tensor], z: Tensor, weights: Sequence[Tensor], with_bias: bool
) -> tuple[Tensor, list[Tensor], Tensor | None]:
    """(dL/dz, [dL/dW_i], dL/db) for ``_linear_forward``, each output with its own gradient: no
    concatenation (q, k and v's gradients come back from SDPA as three tensors).

    The matmuls run in the gradients' dtype, the one the forward matmul ran in (bfloat16 under
    autocast, where z and W are float32), as autograd does for F.linear; dL/dz comes back in z's
    dtype, as through autocast's cast. (Without autocast every cast here is a no-op.)"""
    dz, dws, dbs = None, [], []
    zm = z.to(grads[0].dtype)
    for g, w in zip(grads, weights, strict=True):
        dw, db = _weight_grads(g, zm, with_bias)
        dws.append(dw)
        dbs.append(db)
        g2, wm = g.reshape(-1, g.shape[-1]), w.to(g.dtype)
        dz = g2 @ wm if dz is None else dz.addmm_(g2, wm)
    db = (dbs[0] if len(dbs) == 1 else torch.cat(dbs)) if with_bias else None
    return dz.view(z.shape).to(z.dtype), dws, db


# ---- the autograd functions --------------------------------------------------------------------


class NormLinear(torch.autograd.Function):
    """(h_1, ..., h_k) = LN(x) @ W_i.T + b_i, in one matmul over the concatenated weights (q, k, v).

    Saves x and the weights (parameters, not copies): LN(x) is recomputed in backward, and the
    concatenated W is not needed there. ``norm=None`` is a plain linear with the same saving property.
    """

    @staticmethod
    def forward(ctx, x, norm, gamma, beta, bias, *weights):
        z = x if norm is None else norm(x, gamma, beta)[0]
        ctx.norm, ctx.with_bias, ctx.autocast = norm, bias is not None, autocast_state(x)
        ctx.save_for_backward(x, gamma, beta, *weights)
        return _linear_forward(z, weights, bias)

    @staticmethod
    def backward(ctx, *grads):
        x, gamma, beta, *weights = ctx.saved_tensors
        norm = ctx.norm
        with _as_forward_ran(ctx, x):
            stats = None if norm is None else norm(x, gamma, beta)  # recompute (z, mean, rstd)
            dz, dws, db = _linear_backward(grads, x if stats is None else stats[0], weights, ctx.with_bias)
            if norm is None:
                return dz, None, None, None, db, *dws
            dx, dgamma, dbeta = norm.grad(dz, x, stats, gamma, beta)
        return dx, None, dgamma, dbeta, db, *dws


def residual_sum(x: Tensor, branch: Tensor, alpha: float = 1.0) -> Tensor:
    """The residual combine (docs/concepts.md#residual-connection): x + F(x), or alpha x + F(x)
    (DeepNorm). The one definition the module path (``block.Residual``) and the lean path both use,
    so their sums agree bit for bit."""
    return x + branch if alpha == 1.0 else alpha * x + branch


def _residual(x: Tensor, c: Tensor, wo: Tensor, bo: Tensor | None, alpha: float) -> Tensor:
    """alpha x + (c @ Wo.T + bo): the output projection as F.linear, then the sum, in the order the
    module path computes them (attention's ``o``, then ``Residual``)."""
    return residual_sum(x, F.linear(c, wo, bo), alpha)


class ResidualNormLinear(torch.autograd.Function):
    """s = alpha x + (c @ Wo.T + bo) (the residual add), z = LN(s), h_i = z @ W_i.T + b_i: returns
    (s, z, h_1, ..., h_k).

    Saves x and c, which the block keeps anyway (x for LN1, c as SDPA's output): s, z and the
    statistics are recomputed in backward, at the cost of one (d x d) matmul per token. With
    ``keep_sum`` it saves s and c instead (the speed mode): no recompute, d floats per token more.
    """

    @staticmethod
    def forward(ctx, x, c, wo, bo, alpha, keep_sum, norm, gamma, beta, bias, *weights):
        s = _residual(x, c, wo, bo, alpha)
        z = norm(s, gamma, beta)[0]
        ctx.alpha, ctx.keep_sum, ctx.norm, ctx.with_bias = alpha, keep_sum, norm, bias is not None
        ctx.autocast = autocast_state(x)
        ctx.set_materialize_grads(False)  # the unused output (pre-norm: z, post-norm: s) gets None
        ctx.save_for_backward(s if keep_sum else x, c, wo, bo, gamma, beta, *weights)
        h = _linear_forward(z, weights, bias)
        ctx.h_dtype = h[0].dtype  # bfloat16 under autocast, where s and z are float32
        return s, z, *h

    @staticmethod
    def backward(ctx, gs, gz, *ghs):
        kept, c, wo, bo, gamma, beta, *weights = ctx.saved_tensors
        with _as_forward_ran(ctx, kept):
            s = kept if ctx.keep_sum else _residual(kept, c, wo, bo, ctx.alpha)  # recompute, bit for bit
            stats = ctx.norm(s, gamma, beta)
            # an unused h (only in tests) gets no gradient: nothing flows through its W
            ghs = [g if g is not None else s.new_zeros(*s.shape[:-1], w.shape[0], dtype=ctx.h_dtype)
                   for g, w in zip(ghs, weights, strict=True)]
            dz, dws, db = _linear_backward(ghs, stats[0], weights, ctx.with_bias)
            if gz is not None:
                dz += gz
            ds, dgamma, dbeta = ctx.norm.grad(dz, s, stats, gamma, beta)
            if gs is not None:
                ds += gs
            go = ds.to(c.dtype)  # dL/d(o's output): o ran in c's dtype (bfloat16 under autocast)
            dwo, dbo = _weight_grads(go, c, bo is not None)
            dc = go @ wo.to(go.dtype)
            dx = ds if ctx.alpha == 1.0 else ds * ctx.alpha
        return dx, dc, dwo, dbo, None, None, None, dgamma, dbeta, db, *dws


class ActLinear(torch.autograd.Function):
    """act(*h) @ W.T + b for h = (h,) or gated (h1, h3). Saves h (ReLU: act(h)); act(h) is
    recomputed in backward for dW, act'(h) for dh."""

    @staticmethod
    def forward(ctx, act, weight, bias, *h):
        a = act.forward(*h)
        ctx.act, ctx.with_bias, ctx.autocast = act, bias is not None, autocast_state(h[0])
        ctx.save_for_backward(weight, *((a,) if act.saves_output else h))
        return F.linear(a, weight, bias)

    @staticmethod
    def backward(ctx, g):
        weight, *saved = ctx.saved_tensors
        act = ctx.act
        with _as_forward_ran(ctx, weight):
            a = (saved[0] if act.saves_output else act.forward(*saved)).to(g.dtype)  # as W2 saw it
            dw, db = _weight_grads(g, a, ctx.with_bias)
            # dL/da = g @ W, written over the recomputed act(h): one (N, d_ff) tensor less at the peak
            wm = weight.to(g.dtype)  # the forward matmul's dtype (bfloat16 under autocast)
            da = g @ wm if act.saves_output else torch.matmul(g, wm, out=a)
            return None, dw, db, *act.backward(da, *saved)


class NormFunction(torch.autograd.Function):
    """LN(x) saving x and its statistics (mean, rstd: a float or two per row), as ATen's LayerNorm does: the
    norm of a kind ATen has no backward for. Nothing is recomputed: the output is not needed in backward,
    and keeping the statistics costs a float or two per row against the forward kernel's time again."""

    @staticmethod
    def forward(ctx, x, norm, gamma, beta):
        out, mean, rstd = norm(x, gamma, beta)
        ctx.norm, ctx.autocast = norm, autocast_state(x)
        ctx.save_for_backward(x, mean, rstd, gamma, beta)
        return out

    @staticmethod
    def backward(ctx, g):
        x, mean, rstd, gamma, beta = ctx.saved_tensors
        with _as_forward_ran(ctx, x):
            dx, dgamma, dbeta = ctx.norm.grad(g, x, (None, mean, rstd), gamma, beta)
        return dx, None, dgamma, dbeta


# ---- functional wrappers ------------------------------------------------------------------------


def norm_linear(
    x: Tensor, norm: NormKernel | None, gamma: Tensor | None, beta: Tensor | None,
    weights: Sequence[Tensor], bias: Tensor | None,
) -> tuple[Tensor, ...]:
    """(LN(x) @ W_i.T + b_i for each weight), ``bias`` the concatenated b_i; saves only x (see NormLinear)."""
    return NormLinear.apply(x, norm, gamma, beta, bias, *weights)


def residual_norm_linear(
    x: Tensor, c: Tensor, wo: Tensor, bo: Tensor | None, alpha: float,
    norm: NormKernel, gamma: Tensor | None, beta: Tensor | None,
    weights: Sequence[Tensor], bias: Tensor | None, keep_sum: bool = False,
) -> tuple[Tensor, ...]:
    """(s, LN(s), LN(s) @ W_i.T + b_i for each weight) for s = alpha x + (c @ wo.T + bo), saving x and c
    (``keep_sum``: s and c)."""
    return ResidualNormLinear.apply(x, c, wo, bo, alpha, keep_sum, norm, gamma, beta, bias, *weights)


def act_linear(h: Sequence[Tensor], act: ActKernel, weight: Tensor, bias: Tensor | None) -> Tensor:
    """act(*h) @ weight.T + bias, saving only h (see ActLinear); h = (h,), or (h1, h3) when gated."""
    return ActLinear.apply(act, weight, bias, *h)


def layer_norm(x: Tensor, norm: NormKernel, gamma: Tensor | None, beta: Tensor | None) -> Tensor:
    """LN(x) saving x, mean and rstd (see NormFunction)."""
    return NormFunction.apply(x, norm, gamma, beta)
