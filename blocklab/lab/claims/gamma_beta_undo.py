"""gamma-beta-undo: the tutorials say gamma and beta let the model undo the normalization; they cannot (a
wrong statement, shown wrong; docs/concepts.md has the right one).

Exact: positions with their own means and scales, normalized by blocklab's LayerNorm (float64); the
per-feature gamma and beta that bring the normalized positions closest to the originals (least squares,
solved exactly per feature) and how far from the originals they still are. One position alone, or
positions sharing one mean and one scale, are undone exactly (observations): gamma and beta are shared
by every position, and each position's own mean and scale are gone.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor

from ...nn.norms import LayerNorm
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import exact

TOL = 1e-9  # relative error of an exact undo in float64


def undo_error(x: Tensor) -> float:
    """The relative error left after the best per-feature gamma, beta map LayerNorm(x) back to x."""
    n, d = x.shape  # (positions, features)
    z = LayerNorm(d, eps=1e-12).double()(x).detach()  # (n, d)
    design = torch.stack([z, torch.ones_like(z)], dim=-1).transpose(0, 1)  # (d, n, 2): per feature
    target = x.transpose(0, 1).unsqueeze(-1)  # (d, n, 1)
    solution = torch.linalg.lstsq(design, target).solution  # (d, 2, 1): gamma_j, beta_j
    back = (design @ solution).squeeze(-1).transpose(0, 1)  # (n, d)
    return float((back - x).norm() / x.norm())


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """The undo error for positions with their own means and scales, for one position, and for positions
    sharing a mean and a scale."""
    g = torch.Generator().manual_seed(0)
    n, d = p["positions"], p["d_model"]
    base = torch.randn(n, d, dtype=torch.float64, generator=g)
    means = 3 * torch.randn(n, 1, dtype=torch.float64, generator=g)
    scales = torch.exp(torch.randn(n, 1, dtype=torch.float64, generator=g))
    shared = torch.randn(n, d, dtype=torch.float64, generator=g)
    shared = (shared - shared.mean(-1, keepdim=True)) / shared.std(
        -1, unbiased=False, keepdim=True
    ) * 2.0 + 1.5
    return {
        "own": undo_error(base * scales + means),
        "one_position": undo_error(base[:1] * 2.0 + 1.5),
        "shared": undo_error(shared),
        "positions": n,
        "d_model": d,
    }


def verdict(m: Numbers) -> Verdict:
    """gamma and beta undo the normalization of positions with their own means and scales."""
    return from_tests(
        [
            exact(
                f"per-feature gamma and beta map LayerNorm's output back to its input ({m['positions']} "
                "positions "
                "with their own means and scales)",
                [m["own"]],
                [0.0],
                TOL,
            )
        ],
        observations=[
            f"one position alone: error {m['one_position']:.1e}; positions sharing one mean and one "
            f"scale: {m['shared']:.1e}: undone exactly, as gamma and beta are shared by every position"
        ],
    )


def headline(m: Numbers) -> str:
    """The relative undo error in each case."""
    return (
        f"relative error after the best gamma, beta: own means and scales {m['own']:.2f}, one position "
        f"{m['one_position']:.1e}, shared {m['shared']:.1e}"
    )


def plot(m: Numbers, fig: Figure) -> None:
    """The undo error in each case."""
    ax = fig.subplots()
    cases = {"own mean and scale": m["own"], "one position": m["one_position"], "shared": m["shared"]}
    ax.bar(list(cases), [max(v, 1e-18) for v in cases.values()])
    ax.set(yscale="log", ylabel="relative error", title="LayerNorm undone by the best gamma and beta")


CLAIM = Claim.of(
    __name__,
    name="gamma-beta-undo",
    kind="exact",
    statement="Gamma and beta let the model undo the normalization if it needs to.",
    source=Source(
        "the block tutorials this project implements (the layer-normalization tutorial)",
        "the learned scale and shift",
        "gamma and beta let the model undo the normalization if needed.",
        "'undo the normalization', read as: per-feature gamma and beta that map LayerNorm's output back to "
        "its "
        "input exactly, for positions with their own means and scales (float64, least squares)",
    ),
    method="4,096 positions of width 64 with their own means (N(0, 9)) and scales (log-normal), blocklab's "
    "LayerNorm in float64, the per-feature gamma and beta solved by least squares; the relative error left.",
    setups=(Setup("exact", "exact", "float64 arithmetic: nothing about it can be confounded"),),
    quick={"positions": 256, "d_model": 64},
    full={"positions": 4096, "d_model": 64},
)
