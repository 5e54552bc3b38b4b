"""pre-norm-depth: pre-norm trains deep stacks where post-norm fails (Wang et al. 2019).

Train pre- and post-norm stacks of increasing depth on listops with the same budget (warmup
included), 5 seeds; final held-out accuracy within the budget. The rule is ``needs``: pre-norm's effect
(pre - post, paired by seed) is present at each depth from the source's 20 on and absent at the
shallowest; the margin is the seed noise of post-norm at the shallowest depth (a null arm).
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests, seed_count
from .rules import dose
from .shared import (
    TRAIN_FULL,
    TRAIN_QUICK,
    accuracy_axis,
    median_accuracy,
    null_margin,
    outcome,
    pair,
    pct,
    per_seed,
    seed_lines,
    seeded,
    torch_init,
    trains,
)

NAME = "pre-norm-depth"
POSITIONS = ("pre", "post")


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """Pre- and post-norm stacks at each depth, same budget, each seed; the shallowest post-norm stack from
    the null seeds."""
    arm = lambda pos, d, null=False: seeded(
        NAME, setup, f"{pos}/L{d}", p, {"norm_position": pos, "n_layers": d}, null=null
    )
    return [spec for pos in POSITIONS for d in p["depths"] for spec in arm(pos, d)] + arm(
        "post", p["depths"][0], null=True
    )


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per position, depth and seed: final accuracy, steps to target, divergence."""
    out: dict[str, Any] = {"depths": p["depths"], "deep": p["deep"], "trains_at": p["trains_at"]}
    for pos in POSITIONS:
        out[pos] = [outcome(per_seed(results, NAME, setup, f"{pos}/L{d}", p)) for d in p["depths"]]
    out["null"] = outcome(per_seed(results, NAME, setup, f"post/L{p['depths'][0]}", p, null=True))
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {"depths", "pre": [arm per depth], "post": [...], "null", "trains_at"} (arms: ``shared.outcome``).

    Control: post-norm at the shallowest depth trains on most seeds (the source's baseline works).
    Tests (``needs``), one per depth from "deep" on: pre-norm's effect on held-out accuracy is present there
    and absent at the shallowest depth, paired by seed."""
    depths, pre, post, at = m["depths"], m["pre"], m["post"], m["trains_at"]
    margin = null_margin(
        post[0], m["null"], "accuracy", f"post-norm's held-out accuracy at depth {depths[0]}"
    )
    without, without_alt = pair(post[0], pre[0], "accuracy")
    tests = []
    for i, depth in enumerate(depths):
        if depth >= m["deep"]:
            under, under_alt = pair(post[i], pre[i], "accuracy")
            tests.append(
                dose(
                    f"pre-norm trains better than post-norm at depth {depth} and as well at depth "
                    f"{depths[0]}",
                    under,
                    without,
                    "higher",
                    margin,
                    {w: (under_alt[w], without_alt[w]) for w in under_alt},
                )
            )
    shallow, shallow_n = seed_count(trains(post[0], at))
    return from_tests(
        tests,
        controls=[(f"post-norm trains at depth {depths[0]} (accuracy >= {at:.0%}; {shallow_n})", shallow)],
    )


def headline(m: Numbers) -> str:
    """Median accuracy over seeds per depth, pre and post."""
    med = lambda arms: pct([median_accuracy(a) for a in arms])
    return "depth {}: pre {}, post {} (medians)".format(
        " ".join(map(str, m["depths"])), med(m["pre"]), med(m["post"])
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Median accuracy over seeds against depth, pre and post; each seed as a dot."""
    ax = fig.subplots()
    for pos, style in (("pre", "-o"), ("post", "--x")):
        seed_lines(ax, m["depths"], m[pos], style, f"{pos}-norm")
    ax.set(xlabel="depth (blocks)", ylabel="held-out accuracy", title="accuracy within a fixed budget")
    accuracy_axis(ax)
    ax.legend(fontsize="small")


SOURCE = Setup(
    "xavier",
    "source",
    "blocklab's listops model with Xavier block weights (fairseq's Transformer init, the source's code)",
    init="xavier",
)

CLAIM = Claim.of(
    __name__,
    name=NAME,
    kind="training",
    statement="Pre-norm trains deep stacks where post-norm fails.",
    source=Source(
        "Wang et al. 2019, 'Learning Deep Transformer Models for Machine Translation'; Xiong et al. 2020",
        "Wang et al. sections 2-4",
        "With the norm before each sublayer, a 30-layer encoder trains and beats the 6-layer baseline; "
        "post-norm encoders of 20 or more layers fail to train.",
        "'a 30-layer [pre-norm] encoder trains' and 'post-norm encoders of 20 or more layers fail', read "
        "as a "
        "dose-response (needs): pre-norm's effect on held-out accuracy is present at 20 and 30 layers and "
        "absent at 6",
        {
            "depth": "encoders of 6 to 30 layers, 6-layer decoder",
            "width": "Transformer-base (d_model 512)",
            "init": "Xavier (fairseq's Transformer)",
            "positions": "sinusoidal, token embeddings scaled by sqrt(d_model)",
            "lr": "Adam with the inverse-square-root schedule",
            "warmup": "the schedule's linear warmup",
            "steps": "WMT En-De, trained to convergence",
        },
    ),
    method="Train pre- and post-norm stacks of 6, 20 and 30 layers (the source's range) on listops, 5 seeds, "
    "the same 400-step budget with 50 of warmup; final held-out accuracy (a run stops at 99%), pre-norm's "
    "effect paired by seed with a 95% t interval at each depth, the margin the seed noise of post-norm at 6 "
    "layers (5 other seeds). Scaled down: d_model 64 instead of 512, listops instead of translation.",
    setups=(
        SOURCE,
        torch_init(SOURCE),
        SOURCE.but(
            "low-lr",
            "a 3x lower peak learning rate, 1e-3: whether post-norm's trouble at depth is one of step size",
            train={"lr": 1e-3},
        ),
    ),
    # deep: the source's "20 or more layers", where post-norm fails (quick: a depth the smoke run affords)
    quick={**TRAIN_QUICK, "depths": [2, 8], "deep": 8, "trains_at": 0.3},
    full={**TRAIN_FULL, "depths": [6, 20, 30], "deep": 20, "steps": 400, "trains_at": 0.5},
    notes=(
        "With Xavier weights (the source setup) pre-norm reaches 99-100% held-out at 6, 20 and 30 layers "
        "while post-norm does at 6 layers only (99%) and stays near chance deeper (12% at 20 and 30): the "
        "paired difference is +0.86 at 20 and 30 layers, and at 6 layers +0.0015 with an interval inside "
        "the seed-noise margin of 0.0057. It holds, fragile: at half the margin, or read one evaluation "
        "earlier, the depth-6 part is undecided. With blocklab's default init or a 3x lower learning rate "
        "the 30-layer part holds (+0.88, +0.86) but at 20 layers post-norm trains on some seeds (medians "
        "19% and 99%; intervals -0.02 .. +1.05 and -0.20 .. +0.48), so those setups are inconclusive: how "
        "deep post-norm can go depends on init and learning rate, not on depth alone."
    ),
)
