"""pre-norm-depth: pre-norm trains deep stacks where post-norm struggles.

Train pre- and post-norm stacks of increasing depth on listops with the same budget (warmup
included); held-out accuracy.
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
    accuracy_axis,
    earlier_embedding,
    fin,
    learned_positions,
    pct,
    run_spec,
)

NAME = "pre-norm-depth"
POSITIONS = ("pre", "post")
STRUGGLES = 0.10  # at the deepest depth post-norm ends at least this far below pre-norm


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """Pre- and post-norm stacks at each depth, same budget."""
    return [
        run_spec(NAME, setup, f"{pos}/L{d}", p, {"norm_position": pos, "n_layers": d})
        for pos in POSITIONS
        for d in p["depths"]
    ]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Accuracy, final training loss and divergence per depth for pre- and post-norm."""
    out: dict[str, Any] = {"depths": p["depths"], "trains_at": p["trains_at"]}
    for pos in POSITIONS:
        rs = [results[f"{NAME}/{setup.name}/{pos}/L{d}"] for d in p["depths"]]
        out[pos] = [r["accuracy"] for r in rs]
        out[f"{pos}_loss"] = [r["loss"] for r in rs]
        out[f"{pos}_diverged"] = [r["diverged"] for r in rs]
        out[f"{pos}_steps"] = [r["steps"] for r in rs]
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {"depths", "pre": [acc per depth], "post": [...], "trains_at": acc}."""
    depths, pre, post, trains = m["depths"], m["pre"], m["post"], m["trains_at"]
    return from_checks(
        [
            (
                f"pre-norm trains at every depth up to {depths[-1]} (accuracy >= {trains:.0%})",
                all(fin(a) >= trains for a in pre),
            ),
            (
                f"at depth {depths[-1]} post-norm ends at least {STRUGGLES * 100:.0f} points below pre-norm",
                fin(pre[-1]) - fin(post[-1]) >= STRUGGLES,
            ),
        ]
    )


def headline(m: Numbers) -> str:
    """Accuracy per depth, pre and post."""
    return "depth {}: pre {}, post {}".format(" ".join(map(str, m["depths"])), pct(m["pre"]), pct(m["post"]))


def plot(m: Numbers, fig: Figure) -> None:
    """Accuracy against depth, pre and post."""
    ax = fig.subplots()
    ax.plot(m["depths"], [fin(x) for x in m["pre"]], "-o", label="pre-norm")
    ax.plot(m["depths"], [fin(x) for x in m["post"]], "--x", label="post-norm")
    ax.set(
        xscale="log", xlabel="depth (blocks)", ylabel="held-out accuracy", title="accuracy at a fixed budget"
    )
    accuracy_axis(ax)
    ax.legend(fontsize="small")


SOURCE = Setup("default", "source", "blocklab's listops model with its default embedding, init and schedule")

CLAIM = Claim(
    name=NAME,
    kind="training",
    statement="Pre-norm trains deep stacks where post-norm struggles.",
    source=Source(
        "Wang et al. 2019, 'Learning Deep Transformer Models for Machine Translation'; Xiong et al. 2020",
        "Wang et al. sections 2-4",
        "With the norm before each sublayer, a 30-layer encoder trains and beats the 6-layer baseline; "
        "post-norm encoders of 20 or more layers fail to train.",
        {
            "depth": "encoders of 6 to 30 layers, 6-layer decoder",
            "width": "Transformer-base (d_model 512)",
            "init": "not restated here",
            "positions": "sinusoidal, token embeddings scaled by sqrt(d_model)",
            "lr": "Adam with the inverse-square-root schedule",
            "warmup": "the schedule's linear warmup",
            "steps": "WMT En-De, trained to convergence",
        },
    ),
    method="Train pre- and post-norm stacks of increasing depth on listops with the same budget (warmup "
    "included); held-out accuracy.",
    setups=(
        SOURCE,
        learned_positions(SOURCE),
        earlier_embedding(SOURCE),
        SOURCE.but(
            "low-lr",
            "a 3x lower peak learning rate, 1e-3: whether post-norm's trouble at depth is one of step size",
            train={"lr": 1e-3},
        ),
    ),
    quick={**TRAIN_QUICK, "depths": [4, 12, 24], "trains_at": 0.3},
    full={**TRAIN_FULL, "depths": [6, 24, 48], "steps": 400, "trains_at": 0.5},
    measure=measure,
    verdict=verdict,
    headline=headline,
    plot=plot,
    runs=runs,
    notes=(
        "The earlier record, on the old embedding and in one setup, read 'pre-norm does not train deep "
        "stacks at this budget' (pre-norm between 25% and 42% at every depth) while post-norm stayed at "
        "chance from depth 24. In the full run pre- and post-norm both reach the target at 6, 24 and 48 "
        "layers in the default, learned-positions and low-lr setups, so the claim's first half holds and "
        "its second, post-norm struggling at depth, does not show at this size (d_model 64, 8-token "
        "sequences, 400 steps with 50 of warmup). Only tokens-0.02 reproduces the earlier picture: "
        "post-norm at chance from 24 layers and pre-norm below 50% at every depth. Wang et al. saw "
        "post-norm fail from 20 layers at d_model 512 on translation; this run shows that at the lab's "
        "size that failure needs the small token embedding, not that it never happens at the "
        "source's size. " + EMBEDDING_CHANGE
    ),
)
