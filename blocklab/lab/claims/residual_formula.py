"""residual-formula: the tutorials write the gradient through a stack of residual layers as
1 + prod(dF/dx); it is prod(1 + dF/dx) (a wrong statement, shown wrong; docs/concepts.md has the right one).

Exact: a stack of L residual layers x_{l+1} = x_l + W_l x_l (linear branches, so each Jacobian is exact),
float64: the Jacobian dx_L/dx_0 by autograd against the tutorials' I + W_{L-1} ... W_0 and against the
product (I + W_{L-1}) ... (I + W_0).
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure
from torch.autograd.functional import jacobian

from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import exact

TOL = 1e-10  # float64 rounding of a product of a few 8x8 matrices


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per depth: the largest |entry| of autograd's Jacobian minus each formula's, and the Jacobian's size."""
    rows = []
    g = torch.Generator().manual_seed(0)
    for depth in p["depths"]:
        ws = [0.3 * torch.randn(p["d"], p["d"], dtype=torch.float64, generator=g) for _ in range(depth)]

        def stack(x: torch.Tensor) -> torch.Tensor:  # (d,)
            for w in ws:
                x = x + w @ x
            return x

        jac = jacobian(stack, torch.randn(p["d"], dtype=torch.float64, generator=g))  # (d, d)
        eye = torch.eye(p["d"], dtype=torch.float64)
        product_of_sums, sum_with_product = eye.clone(), eye.clone()
        branch_product = eye.clone()
        for w in ws:
            product_of_sums = (eye + w) @ product_of_sums
            branch_product = w @ branch_product
        sum_with_product = eye + branch_product
        rows.append(
            {
                "depth": depth,
                "jacobian_size": float(jac.abs().max()),
                "tutorials_error": float((jac - sum_with_product).abs().max()),
                "product_error": float((jac - product_of_sums).abs().max()),
            }
        )
    return {"rows": rows}


def verdict(m: Numbers) -> Verdict:
    """The tutorials' 1 + prod(dF/dx) equals the Jacobian (it does not from two layers on); the product of
    (1 + dF/dx) is shown equal beside."""
    rows = [r for r in m["rows"] if r["depth"] > 1]  # at one layer both forms are I + W
    return from_tests(
        [
            exact(
                "the gradient through the stack is 1 + the product of the branches' Jacobians, at every "
                "depth "
                "from 2",
                [r["tutorials_error"] for r in rows],
                [0.0] * len(rows),
                TOL,
            )
        ],
        observations=[
            "the product of (1 + each branch's Jacobian) equals it at every depth (largest error "
            f"{max(r['product_error'] for r in m['rows']):.1e})"
        ],
    )


def headline(m: Numbers) -> str:
    """Each formula's largest error at the deepest depth."""
    r = m["rows"][-1]
    return (
        f"depth {r['depth']}: |J - (1 + prod W)| {r['tutorials_error']:.2g}, |J - prod(1 + W)| "
        f"{r['product_error']:.1e} (|J| {r['jacobian_size']:.2g})"
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Each formula's error against depth."""
    ax = fig.subplots()
    depths = [r["depth"] for r in m["rows"]]
    ax.plot(depths, [max(r["tutorials_error"], 1e-18) for r in m["rows"]], "-o", label="1 + prod(W)")
    ax.plot(depths, [max(r["product_error"], 1e-18) for r in m["rows"]], "--x", label="prod(1 + W)")
    ax.set(
        yscale="log",
        xlabel="residual layers",
        ylabel="max |autograd Jacobian - formula|",
        title="the gradient through a residual stack",
    )
    ax.legend(fontsize="small")


CLAIM = Claim.of(
    __name__,
    name="residual-formula",
    kind="exact",
    statement="Through L residual layers the gradient is 1 + the product of the layers' derivatives.",
    source=Source(
        "the block tutorials this project implements (the residual-connection tutorial)",
        "the gradient through residual connections",
        "dL/dx = dL/dy * (1 + prod dF/dx): the 1 gives the gradient a direct path through every layer.",
        "the formula as written, read as an equality of Jacobians: I + W_{L-1} ... W_0 against autograd's "
        "Jacobian of the stack (float64)",
    ),
    method="L residual layers x_{l+1} = x_l + W_l x_l with random 8x8 W_l (scale 0.3), L = 1, 2, 4, 8, "
    "float64: autograd's Jacobian of x_L in x_0 against I + prod(W_l) and against prod(I + W_l).",
    setups=(Setup("exact", "exact", "float64 arithmetic: nothing about it can be confounded"),),
    quick={"d": 8, "depths": [1, 2, 4]},
    full={"d": 8, "depths": [1, 2, 4, 8]},
)
