"""attention-overwrite: the tutorials say attention can only add to what a token knows, never overwrite it;
an added vector can cancel what is there (a wrong statement, shown wrong; docs/concepts.md has the right
one).

Exact: blocklab's attention (one head, causal, float64) with the value map the identity and the output map
-u u^T for a unit direction u: at the first position, which attends only to itself, the sublayer's output
is -(u . x) u, and the residual sum x + attention(x) keeps nothing of x along u. The rest of x is kept.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from ...nn.attention import MultiHeadAttention
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import exact

TOL = 1e-12  # float64 rounding


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """The component of the first position along u before and after the residual sum, and the change of the
    rest of it, for each of ``p["draws"]`` random inputs and directions."""
    d, g = p["d_model"], torch.Generator().manual_seed(0)
    rows = []
    for _ in range(p["draws"]):
        attn = MultiHeadAttention(d, 1, causal=True, bias=False, fused=False).double()
        u = torch.randn(d, dtype=torch.float64, generator=g)
        u = u / u.norm()
        with torch.no_grad():
            attn.v.weight.copy_(torch.eye(d, dtype=torch.float64))
            attn.o.weight.copy_(-torch.outer(u, u))
            x = torch.randn(1, p["tokens"], d, dtype=torch.float64, generator=g)  # (B, T, d_model)
            summed = x + attn(x)  # the residual sum
        before, after = x[0, 0], summed[0, 0]
        rest = lambda v: v - (v @ u) * u
        rows.append(
            {
                "along_before": float(before @ u),
                "along_after": float(after @ u),
                "rest_change": float((rest(after) - rest(before)).abs().max()),
            }
        )
    return {"rows": rows}


def verdict(m: Numbers) -> Verdict:
    """The residual sum keeps the first position's component along u (it is never overwritten)."""
    rows = m["rows"]
    return from_tests(
        [
            exact(
                "after attention's residual sum, the token still holds what it held along u",
                [r["along_after"] for r in rows],
                [r["along_before"] for r in rows],
                TOL,
            )
        ],
        observations=[
            f"along u the token held |x.u| up to {max(abs(r['along_before']) for r in rows):.2f} and "
            f"holds {max(abs(r['along_after']) for r in rows):.1e} after; the rest of it changed by "
            f"{max(r['rest_change'] for r in rows):.1e}"
        ],
    )


def headline(m: Numbers) -> str:
    """The component along u before and after, first draw."""
    r = m["rows"][0]
    return f"x.u {r['along_before']:+.3f} -> {r['along_after']:+.1e} after x + attention(x); rest kept"


def plot(m: Numbers, fig: Figure) -> None:
    """|x.u| before and after for each draw."""
    ax = fig.subplots()
    rows = m["rows"]
    ax.plot([abs(r["along_before"]) for r in rows], "o", label="before")
    ax.plot([max(abs(r["along_after"]), 1e-18) for r in rows], "x", label="after x + attention(x)")
    ax.set(yscale="log", xlabel="draw", ylabel="|component along u|", title="attention erases a direction")
    ax.legend(fontsize="small")


CLAIM = Claim.of(
    __name__,
    name="attention-overwrite",
    kind="exact",
    statement="Attention can only add to what a token knows, not overwrite it.",
    source=Source(
        "the block tutorials this project implements (the residual-connection tutorial)",
        "the residual stream as a shared workspace",
        "Each sublayer adds to the residual stream: attention can only add to what a token knows, not "
        "overwrite it.",
        "'not overwrite', read as: whatever the weights, the token's component along any direction survives "
        "the residual sum; one choice of weights (value identity, output -u u^T) is enough to show it false",
    ),
    method="blocklab's attention (one head, causal, float64, 16 random inputs of 4 positions and width 16, a "
    "random unit direction u each): value map the identity, output map -u u^T; the first position's "
    "component along u before and after x + attention(x).",
    setups=(Setup("exact", "exact", "float64 arithmetic: nothing about it can be confounded"),),
    quick={"d_model": 16, "tokens": 4, "draws": 4},
    full={"d_model": 16, "tokens": 4, "draws": 16},
)
