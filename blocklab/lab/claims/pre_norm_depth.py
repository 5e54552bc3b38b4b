"""pre-norm-depth: pre-norm trains deep stacks where post-norm fails.

Train pre- and post-norm stacks of increasing depth on listops with the same budget (warmup
included), 3 seeds; final accuracy within the budget.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks, seed_count
from .shared import (
    TRAIN_FULL,
    TRAIN_QUICK,
    accuracy_axis,
    median_accuracy,
    outcome,
    pct,
    per_seed,
    seed_lines,
    seeded,
    torch_init,
    trains,
)

NAME = "pre-norm-depth"
POSITIONS = ("pre", "post")
DEEP = 20  # the source: post-norm encoders of 20 or more layers fail to train


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """Pre- and post-norm stacks at each depth, same budget, each seed."""
    return [
        spec
        for pos in POSITIONS
        for d in p["depths"]
        for spec in seeded(NAME, setup, f"{pos}/L{d}", p, {"norm_position": pos, "n_layers": d})
    ]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per position, depth and seed: final accuracy, steps to target, divergence."""
    out: dict[str, Any] = {"depths": p["depths"], "trains_at": p["trains_at"]}
    for pos in POSITIONS:
        out[pos] = [outcome(per_seed(results, NAME, setup, f"{pos}/L{d}", p)) for d in p["depths"]]
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {"depths", "pre": [arm per depth], "post": [...], "trains_at": acc} (arms: ``shared.outcome``).

    Control: post-norm at the shallowest depth trains on most seeds (the source's baseline works).
    Checks: pre-norm trains at every depth; post-norm fails at every depth from DEEP on."""
    depths, pre, post, at = m["depths"], m["pre"], m["post"], m["trains_at"]
    pre_ok = [seed_count(trains(arm, at)) for arm in pre]
    deep = [
        (d, seed_count([not t for t in trains(arm, at)]))
        for d, arm in zip(depths, post, strict=True)
        if d >= DEEP
    ]
    shallow, shallow_n = seed_count(trains(post[0], at))
    checks = [
        (
            f"pre-norm trains at every depth up to {depths[-1]} (accuracy >= {at:.0%}; "
            + ", ".join(f"depth {d}: {n}" for d, (_, n) in zip(depths, pre_ok, strict=True))
            + ")",
            all(ok for ok, _ in pre_ok),
        )
    ]
    if deep:
        checks.append(
            (
                f"post-norm fails to train from depth {DEEP} on (accuracy < {at:.0%}; "
                + ", ".join(f"depth {d}: {n}" for d, (_, n) in deep)
                + ")",
                all(ok for _, (ok, _) in deep),
            )
        )
    return from_checks(
        checks,
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
    method="Train pre- and post-norm stacks of 6, 20 and 30 layers (the source's range) on listops, 3 seeds, "
    "the same 400-step budget with 50 of warmup; a depth trains when most seeds reach 50% (chance is 10%). "
    "Scaled down: d_model 64 instead of 512, listops instead of translation.",
    setups=(
        SOURCE,
        torch_init(SOURCE),
        SOURCE.but(
            "low-lr",
            "a 3x lower peak learning rate, 1e-3: whether post-norm's trouble at depth is one of step size",
            train={"lr": 1e-3},
        ),
    ),
    quick={**TRAIN_QUICK, "depths": [4, 12, 24], "trains_at": 0.3},
    full={**TRAIN_FULL, "depths": [6, 20, 30], "steps": 400, "trains_at": 0.5},
    notes=(
        "With the source's Xavier init (xavier), pre-norm stacks of 6, 20 and 30 layers reach the target "
        "on every seed while post-norm trains at 6 layers and stays near chance at 20 and 30 on every "
        "seed: the claim holds as Wang et al. state it. With blocklab's init (torch-init) it holds too, "
        "post-norm failing at 20 layers on 2 of 3 seeds. At a 3x lower peak learning rate (low-lr) "
        "post-norm trains at 20 layers on every seed and fails only at 30, so the depth at which "
        "post-norm stops training moves with the step size; pre-norm trains at every depth at both rates. "
        "The earlier record ran only GPT-2's N(0, 0.02) init and saw no post-norm failure at depth; its "
        "note blamed the token embedding, which no setup here varies, and the issue's reproduction with "
        "Xavier weights saw the failure, as this run does."
    ),
)
