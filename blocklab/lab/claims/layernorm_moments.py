"""layernorm-moments: LayerNorm's output has mean 0 and variance 1 (docs/concepts.md#layer-normalization).

Exact: blocklab's LayerNorm in float64 on positions of known variance. The output variance is
var/(var+eps), not 1: the shortfall is eps's, visible when the input variance nears eps; dividing
by d instead of d-1 plays no part ((d-1)/d would be the same at every scale).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from matplotlib.figure import Figure

from ...nn.norms import LayerNorm
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import exact

MEAN_TOL = 1e-6  # |output mean| that counts as 0: float64 rounding at these sizes is ~1e-15
VAR_TOL = 1e-3  # a shortfall below variance 1 this small is invisible at float32 activations' scale
PREDICTED_TOL = 1e-6  # |output variance - var/(var+eps)|: the formula holds


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Output mean and variance of blocklab's LayerNorm (float64) on inputs of known variance."""
    d, eps = p["d_model"], 1e-5
    ln = LayerNorm(d, eps=eps).double()
    g = torch.Generator().manual_seed(0)
    rows = []
    for var in p["input_vars"]:
        z = torch.randn(p["n"], d, generator=g, dtype=torch.float64)
        z = (z - z.mean(-1, keepdim=True)) / z.std(-1, unbiased=False, keepdim=True)  # variance exactly 1
        z = 3.0 + z * math.sqrt(var)  # per-position mean 3, variance var
        with torch.no_grad():
            out = ln(z)  # (n, d)
        rows.append(
            {
                "input_var": var,
                "out_mean": float(out.mean(-1).abs().max()),
                "out_var": float(out.var(-1, unbiased=False).mean()),
                "predicted_var": var / (var + eps),
            }
        )
    return {"eps": eps, "d_model": d, "d_minus_1_over_d": (d - 1) / d, "rows": rows}


def verdict(m: Numbers) -> Verdict:
    """m: {"rows": [{"input_var", "out_mean", "out_var", "predicted_var"}]}: exact tests of the mean (0) and
    the variance (1 up to eps: var/(var+eps)) at every input scale; the shortfall below 1 is reported
    beside, with its size."""
    rows = m["rows"]
    shortfall = ", ".join(f"{1 - r['out_var']:.1e} at var {r['input_var']:g}" for r in rows)
    return from_tests(
        [
            exact(
                "the output mean is 0 at every input scale",
                [r["out_mean"] for r in rows],
                [0.0] * len(rows),
                MEAN_TOL,
            ),
            exact(
                "the output variance is 1 up to eps, var/(var+eps), at every input scale",
                [r["out_var"] for r in rows],
                [r["predicted_var"] for r in rows],
                PREDICTED_TOL,
            ),
        ],
        observations=[
            f"the shortfall below variance 1 is eps/(var+eps): {shortfall}; under {VAR_TOL:g} while the "
            f"input variance is above {m['eps'] / VAR_TOL:g}"
        ],
    )


def headline(m: Numbers) -> str:
    """Output variance at two small input variances, and the largest |mean|."""
    rows = m["rows"][1:4:2]
    return (
        "var out at var in {}: ".format("/".join(f"{r['input_var']:g}" for r in rows))
        + " / ".join(f"{r['out_var']:.5f}" for r in rows)
        + f"; max |mean| {max(r['out_mean'] for r in m['rows']):.1e}"
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Measured output variance against var/(var+eps), 1 and (d-1)/d."""
    ax = fig.subplots()
    xs = [r["input_var"] for r in m["rows"]]
    ax.plot(xs, [r["out_var"] for r in m["rows"]], "o", label="measured output variance")
    ax.plot(xs, [r["predicted_var"] for r in m["rows"]], "-", label="var / (var + eps)")
    ax.axhline(1.0, color="grey", ls=":", label="1")
    ax.axhline(m["d_minus_1_over_d"], color="red", ls=":", lw=0.8, label="(d-1)/d (not the cause)")
    ax.set(
        xscale="log",
        xlabel="input variance per position",
        ylabel="output variance",
        title=f"LayerNorm output variance, eps = {m['eps']:g}",
    )
    ax.legend(fontsize="small")


CLAIM = Claim.of(
    __name__,
    name="layernorm-moments",
    kind="exact",
    statement="LayerNorm's output has mean 0 and variance 1.",
    source=Source(
        "Ba, Kiros and Hinton 2016, 'Layer Normalization'",
        "section 3, equation 4 (statistics over the features of one position)",
        "LayerNorm re-centres and re-scales each position's vector by its own mean and standard "
        "deviation; tutorials conclude: the output has mean 0 and variance 1.",
        "'mean 0' and 'variance 1', read as the formula gives them: variance var/(var+eps), 1 up to eps",
    ),
    method="blocklab's LayerNorm (d=64, eps=1e-5, float64) on positions of known variance; output mean "
    "and (biased) variance against var/(var+eps). The shortfall below 1 is eps's, not a d-1 effect: "
    "(d-1)/d would be 0.984 at every scale.",
    setups=(
        Setup("exact", "exact", "float64 arithmetic on synthetic inputs: nothing about it can be confounded"),
    ),
    quick={"d_model": 64, "n": 256, "input_vars": [1.0, 1e-2, 0.01186, 1e-3, 1e-4, 1e-5]},
    full={"d_model": 64, "n": 4096, "input_vars": [1.0, 1e-2, 0.01186, 1e-3, 1e-4, 1e-5, 1e-6]},
    notes=(
        "The output mean is 0 and the output variance is exactly var/(var+eps) at every input scale: "
        "LayerNorm's output has variance 1 up to eps, which is what the formula says. The shortfall below "
        "1 (an observation, with its size per scale) is invisible while the input variance is far above "
        "eps and reaches half when the variance equals eps. The earlier record reported this arithmetic "
        "as 'partly' against a tolerance of its own choosing."
    ),
)
