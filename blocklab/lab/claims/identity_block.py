"""identity-block: with a residual connection a block can learn to do nothing: with its branches' output
weights at zero it is the identity (the block tutorials).

Exact: a fresh listops model's blocks with the attention output projection and the FFN's second
matrix (weights and biases) set to zero, in float64: each block's output against its input, for a
pre-norm block (the residual stream passes untouched) and a post-norm one (the norm after the sum
still acts: an observation, since the tutorials' sentence is about the residual path).
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import exact
from .shared import fresh_model, listops_batch

ZEROED = ("attn.o", "ffn.w2")  # the last linear map of each branch: zero weights and bias, zero output
TOL = 1e-12  # float64 rounding


def block_change(p: dict[str, Any], setup: Setup, position: str) -> list[float]:
    """Per block, max |block(x) - x| with the branches' last maps zeroed, in float64."""
    model = fresh_model(p, setup, 0, norm_position=position).double()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(f".{z}." in name for z in ZEROED):
                param.zero_()
        inputs, _ = listops_batch(p["batch"])
        x = model.embed(inputs)  # (B, T, d_model) float64: the token vectors as the first block's input
        changes = []
        for block in model.blocks:
            y = block(x)
            changes.append(float((y - x).abs().max()))
            x = y
    return changes


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """``block_change`` of pre- and post-norm stacks."""
    return {position: block_change(p, setup, position) for position in ("pre", "post")}


def verdict(m: Numbers) -> Verdict:
    """m: {"pre": [per block], "post": [...]}: the pre-norm blocks are the identity within float64
    rounding."""
    return from_tests(
        [
            exact(
                "with its branches' output maps at zero, every pre-norm block returns its input unchanged",
                m["pre"],
                [0.0] * len(m["pre"]),
                TOL,
            )
        ],
        observations=[
            f"a post-norm block with the same zeros changes its input by up to {max(m['post']):.2g}: "
            "its norm after the sum still normalizes, so doing nothing also needs gamma and beta to "
            "undo that norm, which they cannot for every input (gamma-beta-undo)"
        ],
    )


def headline(m: Numbers) -> str:
    """The largest change per norm position."""
    return f"max |block(x) - x|: pre-norm {max(m['pre']):.1e}, post-norm {max(m['post']):.2g}"


def plot(m: Numbers, fig: Figure) -> None:
    """The change per block, both positions."""
    ax = fig.subplots()
    for position, style in (("pre", "-o"), ("post", "--x")):
        ax.plot(
            range(len(m[position])), [max(v, 1e-18) for v in m[position]], style, label=f"{position}-norm"
        )
    ax.set(
        yscale="log", xlabel="block", ylabel="max |block(x) - x|", title="blocks with zeroed branch outputs"
    )
    ax.legend(fontsize="small")


CLAIM = Claim.of(
    __name__,
    name="identity-block",
    kind="exact",
    statement="With a residual connection the model can learn 'do nothing' as a valid transformation.",
    source=Source(
        "the block tutorials this project implements (the residual-connection tutorial)",
        "why residual connections help",
        "With the residual, the model can learn 'do nothing' (F(x) = 0) as a valid transformation: the "
        "block then passes its input through unchanged.",
        "'do nothing', read as: with the branches' last maps at zero (F(x) = 0) a pre-norm block's output "
        "equals its input exactly (float64)",
    ),
    method="A fresh listops model (blocklab's default init, 2 blocks, float64) with the attention output "
    "projection and the FFN's second matrix (weights and biases) at zero; each block's output against its "
    "input on 64 listops sequences, pre-norm (tested) and post-norm (shown).",
    setups=(
        Setup(
            "exact", "exact", "float64 arithmetic of one model's forward: nothing about it can be confounded"
        ),
    ),
    quick={"d_model": 32, "batch": 8},
    full={"d_model": 64, "batch": 64},
)
