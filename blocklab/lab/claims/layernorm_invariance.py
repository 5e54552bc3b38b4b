"""layernorm-invariance: LayerNorm normalizes each position on its own, so one position's output does not
depend on the rest of the batch or on train/eval mode; BatchNorm's depends on both (Ba et al. 2016).

Exact: one listops sequence's logits from a fresh model with other batch-mates, and in train against eval
mode, for LayerNorm and BatchNorm (norm="batch": statistics over batch and positions, running statistics
in eval). "Does not depend" is read as equal within float32 rounding of the logits (SAME); "depends" as a
change far above it.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .layernorm_vs_batchnorm import CLAIM as TRAINED
from .layernorm_vs_batchnorm import NORMS
from .rules import exact, exact_below
from .shared import bars, fresh_model, listops_batch

SAME = 1e-5  # |logit change| within float32 rounding of logits of size ~10 (2^-23 x 10 x a few ops)


def invariance(p: dict[str, Any], setup: Setup) -> dict[str, dict[str, float]]:
    """How much one sequence's logits move when its batch-mates change, and between train and eval mode."""
    n = p["batch"]
    inputs, _ = listops_batch(2 * n, "test")
    batch_a = inputs[:n]
    batch_b = torch.cat([inputs[:1], inputs[n : 2 * n - 1]])  # same first sequence, new mates
    out = {}
    for norm in NORMS:
        model = fresh_model(p, setup, 0, norm=norm)
        with torch.no_grad():
            model.train()
            a, b = model(batch_a)[0], model(batch_b)[0]  # (T, vocab) each
            model.eval()
            a_eval = model(batch_a)[0]
        out[norm] = {
            "batch_change": float((a - b).abs().max()),
            "mode_change": float((a - a_eval).abs().max()),
        }
    return out


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """``invariance`` of both norms."""
    return invariance(p, setup)


def verdict(m: Numbers) -> Verdict:
    """m: {norm: {"batch_change", "mode_change"}}: LayerNorm's changes are 0 within SAME; BatchNorm's are
    above it."""
    ln, bn = m["standard"], m["batch"]
    return from_tests(
        [
            exact(
                "LayerNorm's output for a sequence does not change with the rest of the batch",
                [ln["batch_change"]],
                [0.0],
                SAME,
            ),
            exact("LayerNorm's output is the same in train and eval mode", [ln["mode_change"]], [0.0], SAME),
            exact_below(
                f"BatchNorm's output changes with the rest of the batch (by more than {SAME:g})",
                SAME,
                bn["batch_change"],
            ),
            exact_below(
                f"BatchNorm's output differs between train and eval mode (by more than {SAME:g})",
                SAME,
                bn["mode_change"],
            ),
        ]
    )


def headline(m: Numbers) -> str:
    """The largest logit changes of both norms."""
    return "; ".join(
        f"{name}: batch-mates {m[norm]['batch_change']:.1e}, mode {m[norm]['mode_change']:.1e}"
        for norm, name in (("standard", "LayerNorm"), ("batch", "BatchNorm"))
    )


def plot(m: Numbers, fig: Figure) -> None:
    """How much one sequence's logits change with batch-mates and mode."""
    ax = fig.subplots()
    changes = {
        name: [max(m[norm]["batch_change"], 1e-12), max(m[norm]["mode_change"], 1e-12)]
        for norm, name in (("standard", "LayerNorm"), ("batch", "BatchNorm"))
    }
    bars(ax, ["other batch-mates", "train vs eval"], changes, "max |change| of logits")
    ax.set(yscale="log", title="one sequence's output changes with ...")


CLAIM = Claim.of(
    __name__,
    name="layernorm-invariance",
    kind="exact",
    statement="LayerNorm's output for a position depends neither on the rest of the batch nor on train/eval "
    "mode; BatchNorm's depends on both.",
    source=Source(
        TRAINED.source.citation,
        "Ba et al. sections 1 and 3",
        "Layer normalization ... performs exactly the same computation at training and test times; it does "
        "not introduce any new dependencies between training cases.",
        "'exactly the same computation' and 'no dependencies between training cases', read as: the logits "
        f"equal within float32 rounding ({SAME:g}) with other batch-mates and in either mode; BatchNorm's "
        "change by more",
    ),
    method="A fresh listops model (blocklab's default init), LayerNorm and then BatchNorm: one sequence's "
    "logits with 15 batch-mates and with 15 others, and in train against eval mode; the largest change.",
    setups=(
        Setup("exact", "exact", "arithmetic of one model's forward: nothing about it can be confounded"),
    ),
    quick={"d_model": 32, "batch": 16},
    full={"d_model": 64, "batch": 16},
)
