"""gelu-approximations: the tanh and sigmoid forms of GELU are close to the exact x * Phi(x).

Exact: the largest |approximation - exact| on a fine float64 grid over [-10, 10].
"""

from __future__ import annotations

import math
from typing import Any

import torch
from matplotlib.figure import Figure

from ...nn.activations import gelu_sigmoid, gelu_tanh
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks

CLOSE = 1e-3  # max |error| that counts as close
FORMS = {"tanh": gelu_tanh, "sigmoid": gelu_sigmoid}


def _exact(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # the definition x * Phi(x)


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Max |approximation - exact GELU| over [-10, 10] on a fine float64 grid, and where it is."""
    x = torch.linspace(-10, 10, p["points"], dtype=torch.float64)
    exact = _exact(x)
    out = {}
    for form, fn in FORMS.items():
        err = (fn(x) - exact).abs()
        i = int(err.argmax())
        out[form] = {"max_err": float(err[i]), "at": float(x[i])}
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {form: {"max_err": float, "at": float}} for the tanh and sigmoid forms."""
    return from_checks(
        [
            (
                f"the {form} form is within {CLOSE:g} of exact GELU everywhere on [-10, 10] "
                f"(max error {r['max_err']:.3g} at x = {r['at']:.2f})",
                r["max_err"] < CLOSE,
            )
            for form, r in m.items()
        ]
    )


def headline(m: Numbers) -> str:
    """Each form's largest error and where."""
    return " ".join(f"{k} {v['max_err']:.3g} at {v['at']:.2f}" for k, v in m.items())


def plot(m: Numbers, fig: Figure) -> None:
    """|approximation - exact| over [-6, 6] for both forms."""
    ax = fig.subplots()
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    for form, fn in FORMS.items():
        ax.plot(
            x, (fn(x) - _exact(x)).abs(), label=f"{form}: max {m[form]['max_err']:.3g} at {m[form]['at']:.2f}"
        )
    ax.set(yscale="log", xlabel="x", ylabel="|approximation - exact|", title="GELU approximation error")
    ax.legend(fontsize="small")


CLAIM = Claim(
    name="gelu-approximations",
    kind="exact",
    statement="The tanh and sigmoid approximations of GELU are close to the exact x * Phi(x).",
    source=Source(
        "Hendrycks and Gimpel 2016, 'Gaussian Error Linear Units (GELUs)'",
        "section 2",
        "GELU can be approximated by 0.5x(1 + tanh[sqrt(2/pi)(x + 0.044715x^3)]) or by x * sigmoid(1.702x).",
    ),
    method="Max |approximation - exact| over [-10, 10] on an evenly spaced float64 grid; close = below 1e-3.",
    setups=(Setup("exact", "exact", "float64 arithmetic on a grid: nothing about it can be confounded"),),
    quick={"points": 2_000_001},
    full={"points": 20_000_001},
    measure=measure,
    verdict=verdict,
    headline=headline,
    plot=plot,
    notes="The tanh form is close (error below 5e-4); the sigmoid form is about 2% off near |x| = 2.3.",
)
