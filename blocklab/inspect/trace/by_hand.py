"""A vector a learner types, through a norm, an activation or the FFN, step by step (``blocklab explain``):
the tutorials' [4, 2, 0, -2] through LayerNorm is mu 1, var 5, sqrt(var + eps), z_hat, then gamma and beta.

Each is the library's own code run on the vector in float64: the norm a config builds
(``norms.build_norm``, its statistics ``layer_norm_stats``), each activation kind's function
(activation_kinds.py), a model's FFN module with its weights. The steps are the walk's (walk.py's
``WalkStep``, printed by ``render_steps``), the norm's the very steps the walk shows for a norm stage.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ...nn.activation_kinds import ACTIVATION_KINDS
from ...nn.activations import implementation
from ...nn.norm_kinds import NORM_KINDS
from ...nn.norms import build_norm
from .collect import norm_numbers
from .walk import LINEARS, WalkStep, make_step, norm_steps

ROW = ["x"]  # the one row of a typed vector


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0].rstrip(".") if text else ""


def _need_length(what: str, values: Tensor | None, n: int) -> None:
    if values is not None and values.numel() != n:
        raise ValueError(f"{what} has {values.numel()} numbers; the vector has {n}: give {n}")


def norm_by_hand(x: Tensor, norm: str = "standard", eps: float = 1e-5, gamma: Tensor | None = None,
                 beta: Tensor | None = None) -> list[WalkStep]:
    """The steps of the norm kind ``norm`` (norm_kinds.NORM_KINDS) on the vector ``x`` (d,): its input, mu,
    var, the denominator, z_hat, gamma and beta (ones and zeros unless given), its output."""
    kind = NORM_KINDS.get(norm)
    if kind is None:
        raise ValueError(f"norm={norm!r} is not one of: {', '.join(NORM_KINDS)}")
    if kind.normalises and not kind.per_position:
        per = ", ".join(n for n, k in NORM_KINDS.items() if k.per_position or not k.normalises)
        raise ValueError(f"norm={norm!r} ({kind.label}) normalises each feature over a batch, not one "
                         f"vector; a vector goes through: {per}")
    for what, given, has in (("gamma", gamma, kind.normalises and kind.scale),
                             ("beta", beta, kind.has_bias(True))):
        if given is not None and not has:
            raise ValueError(f"norm={norm!r} ({kind.label}) has no {what}")
        _need_length(what, given, x.numel())
    x = x.to(torch.float64).reshape(-1)
    module = build_norm(norm, x.numel(), eps, bias=True, dtype=torch.float64)  # beta 0 unless given
    with torch.no_grad():
        if gamma is not None:
            module.weight.copy_(gamma.to(torch.float64) - kind.scale_offset)  # gamma = offset + weight
        if beta is not None:
            module.bias.copy_(beta.to(torch.float64))
        out = module(x[None])
    if not kind.normalises:
        return [make_step("input", "the vector", x, ROW, None, "x", per_row=False),
                make_step("output", f"{kind.label}: {kind.explains}", out, ROW, None, "out")]
    return norm_steps(norm_numbers(module, x[None, None], [0]), kind.label, kind.label, out, ROW, norm)


def activations_by_hand(x: Tensor, names: list[str] | None = None) -> list[WalkStep]:
    """The vector ``x`` and each activation kind's value per element (every kind unless ``names``); a gated
    kind's is its gate function's, which the FFN multiplies by W3 x + b3."""
    names = list(ACTIVATION_KINDS) if names is None else names
    unknown = [n for n in names if n not in ACTIVATION_KINDS]
    if unknown:
        raise ValueError(f"activation={unknown[0]!r} is not one of: {', '.join(ACTIVATION_KINDS)}")
    x = x.to(torch.float64).reshape(-1)
    steps = [make_step("x", "the vector", x, ROW, None, "x", per_row=False)]
    for name in names:
        kind = ACTIVATION_KINDS[name]
        function = implementation(kind)[0]
        formula = _first_line(function.__doc__)
        if kind.gated:
            formula = f"the gate {function.__name__}: {formula}; the FFN takes it times W3 x + b3"
        steps.append(make_step(name, formula, function(x), [name], None, name, per_row=False))
    return steps


def ffn_by_hand(x: Tensor, ffn: nn.Module, where: str = "") -> list[WalkStep]:
    """The FFN module ``ffn`` (feedforward.FeedForward, a copy run in float64) on the vector ``x``
    (d_model,): W1 x + b1, (gated: W3 x + b3 and the gate,) the activation, W2 h + b2."""
    if x.numel() != ffn.d_model:
        raise ValueError(f"the vector has {x.numel()} numbers; the FFN reads d_model = {ffn.d_model}: give "
                         f"{ffn.d_model}")
    ffn = copy.deepcopy(ffn).to(torch.float64).eval()
    x = x.to(torch.float64).reshape(1, -1)
    with torch.no_grad():
        h = ffn.project_in(x)
        act = ffn.act_kernel.forward(*h)
        out = ffn(x)

    def step(kind: str, values: Tensor, title: str = "", formula: str = "") -> WalkStep:
        linear_formula, linear_title = LINEARS.get(kind, ("", ""))
        formula = formula or linear_formula.format(act=ffn.activation)
        return make_step(f"{where}{title or linear_title}", formula, values, ROW, None, kind)

    steps = [step("x", x, "x", f"the vector, d_model = {ffn.d_model}"), step("ffn.hidden", h[0])]
    if len(h) > 1:
        steps += [step("ffn.linear", h[1]),
                  step("ffn.gate", ffn.gate(h[0]), f"gate {ffn.gate_name}(W1 x + b1)",
                       f"{ffn.gate_name} of each unit of W1 x + b1; the activation is it times W3 x + b3")]
    return [*steps, step("ffn.act", act), step("ffn.out", out, "W2 h + b2 = FFN(x)",
                                               "activation W2^T + b2: the FFN's output")]
