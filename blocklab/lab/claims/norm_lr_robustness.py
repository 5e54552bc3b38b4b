"""norm-lr-robustness: LayerNorm makes training robust to the learning rate.

Train with LayerNorm (standard) and without (norm none) over a learning-rate sweep; held-out
accuracy at the same budget.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks
from .shared import (
    EMBEDDING_CHANGE,
    TRAIN_FULL,
    TRAIN_QUICK,
    accuracy,
    accuracy_axis,
    earlier_embedding,
    fin,
    learned_positions,
    pct,
    run_spec,
)

NAME = "norm-lr-robustness"
NORMS = ("standard", "none")


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """With and without LayerNorm, over the learning-rate sweep."""
    return [
        run_spec(NAME, setup, f"{norm}/lr{lr:g}", p, {"norm": norm}, lr=lr)
        for norm in NORMS
        for lr in p["lrs"]
    ]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Accuracy per learning rate, with and without LayerNorm."""
    out: dict[str, Any] = {"lrs": p["lrs"], "trains_at": p["trains_at"]}
    for norm in NORMS:
        out[norm] = [accuracy(results, f"{NAME}/{setup.name}/{norm}/lr{lr:g}") for lr in p["lrs"]]
    return out


def good(accuracies: list[float | None], trains_at: float) -> int:
    """How many learning rates reached ``trains_at``."""
    return sum(fin(x) >= trains_at for x in accuracies)


def verdict(m: Numbers) -> Verdict:
    """m: {"lrs", "standard": [acc per lr], "none": [...], "trains_at": acc}."""
    trains, ln, none = m["trains_at"], m["standard"], m["none"]
    return from_checks(
        [
            (
                f"LayerNorm reaches {trains:.0%} at more learning rates ({good(ln, trains)} of {len(ln)}) "
                f"than no norm ({good(none, trains)})",
                good(ln, trains) > good(none, trains),
            ),
            (
                "LayerNorm's worst accuracy over the sweep is higher than no norm's",
                min(map(fin, ln)) > min(map(fin, none)),
            ),
        ]
    )


def headline(m: Numbers) -> str:
    """Accuracy per learning rate, with and without LayerNorm."""
    return "lr {}: LN {}, none {}".format(
        " ".join(f"{x:g}" for x in m["lrs"]), pct(m["standard"]), pct(m["none"])
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Accuracy against the peak learning rate."""
    ax = fig.subplots()
    ax.plot(m["lrs"], [fin(x) for x in m["standard"]], "-o", label="LayerNorm")
    ax.plot(m["lrs"], [fin(x) for x in m["none"]], "--x", label="no norm")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="held-out accuracy", title="learning-rate sweep")
    accuracy_axis(ax)
    ax.legend(fontsize="small")


SOURCE = Setup(
    "default", "source", "blocklab's listops model (post-norm) with its default embedding and init"
)

CLAIM = Claim(
    name=NAME,
    kind="training",
    statement="LayerNorm makes training robust to the learning rate.",
    source=Source(
        "Ioffe and Szegedy 2015, 'Batch Normalization'; carried over to LayerNorm by tutorials",
        "section 3.3 ('Batch Normalization enables higher learning rates')",
        "Normalization keeps a layer's output independent of the scale of its weights, so higher learning "
        "rates do not blow up the activations or the gradients; tutorials say the same of LayerNorm.",
        {
            "depth": "Inception (ImageNet)",
            "width": "Inception",
            "init": "not restated here",
            "positions": "none (images)",
            "lr": "the base rate, 5x and 30x it",
            "warmup": "none",
            "steps": "millions of images",
        },
    ),
    method="Train with LayerNorm (standard) and without (norm none) over a learning-rate sweep; held-out "
    "accuracy at the same budget.",
    setups=(SOURCE, learned_positions(SOURCE), earlier_embedding(SOURCE)),
    quick={**TRAIN_QUICK, "lrs": [1e-3, 1e-2, 1e-1], "trains_at": 0.3},
    full={**TRAIN_FULL, "lrs": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1], "trains_at": 0.9},
    measure=measure,
    verdict=verdict,
    headline=headline,
    plot=plot,
    runs=runs,
    notes=(
        "The earlier record had LayerNorm and no norm reach the target at as many learning rates as each "
        "other, from the default setup alone. In every setup LayerNorm's worst accuracy over the sweep is "
        "above no norm's (no norm diverges at the highest rate), but the count of rates reaching 90% "
        "depends on the setup: more for LayerNorm only with learned positions, as many in the default "
        "setup, fewer in tokens-0.02. At the second-highest rate no norm ends above LayerNorm in every "
        "setup: what LayerNorm buys here is no divergence, not a wider range of good learning rates. "
        + EMBEDDING_CHANGE
    ),
)
