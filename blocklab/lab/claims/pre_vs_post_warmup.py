"""pre-vs-post-warmup: post-norm needs learning-rate warmup at a high learning rate; pre-norm does not.

Train post- and pre-norm stacks at a high peak learning rate with linear warmup and without
(warmup 0); held-out accuracy at the same budget (a diverged run counts as 0).
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
    curves,
    earlier_embedding,
    fin,
    learned_positions,
    pct,
    run_spec,
)

NAME = "pre-vs-post-warmup"
POSITIONS = ("post", "pre")
SCHEDULES = ("warmup", "no_warmup")
NEEDS = 0.10  # post-norm without warmup ends at least this far below with warmup
NO_NEED = 0.05  # pre-norm without warmup ends within this of with warmup


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """Post- and pre-norm with and without warmup, at the setup's learning rate."""
    return [
        run_spec(
            NAME,
            setup,
            f"{pos}/{sched}",
            p,
            {"norm_position": pos, "n_layers": p["depth"]},
            warmup=p["warmup"] if sched == "warmup" else 0,
        )
        for pos in POSITIONS
        for sched in SCHEDULES
    ]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Final accuracy (0 if diverged) of each of the four runs, and their curves."""
    lr = setup.train.get("lr", p["lr"])
    out: dict[str, Any] = {"lr": lr, "warmup_steps": p["warmup"], "depth": p["depth"], "curves": {}}
    for pos in POSITIONS:
        out[pos] = {}
        for sched in SCHEDULES:
            r = results[f"{NAME}/{setup.name}/{pos}/{sched}"]
            out[pos][sched] = r["accuracy"]
            out[pos][f"{sched}_diverged"] = r["diverged"]
            out["curves"][f"{pos}-norm, {sched.replace('_', ' ')}"] = r["curve"]
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {"lr", "post": {"warmup": acc, "no_warmup": acc}, "pre": {...}} (a diverged run has accuracy 0)."""
    post, pre = m["post"], m["pre"]
    return from_checks(
        [
            (
                f"at lr {m['lr']:g} post-norm without warmup ends at least {NEEDS * 100:.0f} points below "
                "post-norm with warmup",
                fin(post["warmup"]) - fin(post["no_warmup"]) >= NEEDS,
            ),
            (
                f"at lr {m['lr']:g} pre-norm without warmup ends within {NO_NEED * 100:.0f} points of "
                "pre-norm with warmup",
                fin(pre["warmup"]) - fin(pre["no_warmup"]) <= NO_NEED,
            ),
        ]
    )


def headline(m: Numbers) -> str:
    """Accuracy with and without warmup, post and pre."""
    post, pre = m["post"], m["pre"]
    return (
        f"lr {m['lr']:g}: post {pct([post['warmup'], post['no_warmup']])}, "
        f"pre {pct([pre['warmup'], pre['no_warmup']])} (warmup, none)"
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Held-out accuracy during training, the four runs."""
    ax = fig.subplots()
    curves(ax, m["curves"])
    ax.set(title=f"lr {m['lr']:g}, {m['depth']} layers, warmup {m['warmup_steps']} steps or none")


SOURCE = Setup(
    "paper-lr",
    "source",
    "the paper's larger peak learning rate, 1e-3 (it used Adam at 5e-4 and 1e-3)",
    train={"lr": 1e-3},
)

CLAIM = Claim(
    name=NAME,
    kind="training",
    statement="Post-norm needs learning-rate warmup at a high learning rate; pre-norm does not.",
    source=Source(
        "Xiong et al. 2020, 'On Layer Normalization in the Transformer Architecture'",
        "section 3.1 (Figure 2) and section 4",
        "The warm-up stage is essential for the Post-LN Transformer: without it, it ends far worse; "
        "the Pre-LN Transformer can be trained without warm-up.",
        {
            "depth": "6 encoder and 6 decoder layers (IWSLT14 De-En)",
            "width": "d_model 512",
            "init": "Xavier",
            "positions": "sinusoidal, token embeddings scaled by sqrt(d_model)",
            "lr": "Adam, peak 5e-4 or 1e-3",
            "warmup": "500 or 4,000 steps vs none",
            "steps": "tens of epochs of IWSLT14",
        },
    ),
    method="Train post- and pre-norm stacks at the source's depth and a high peak learning rate with linear "
    "warmup and without (warmup 0); held-out accuracy at the same budget (a diverged run counts as 0).",
    setups=(
        SOURCE,
        SOURCE.but(
            "high-lr",
            "a 10x higher peak learning rate, 1e-2 (the earlier record's): stability is the claim, so the "
            "learning rate is a confound",
            train={"lr": 1e-2},
        ),
        learned_positions(SOURCE),
        earlier_embedding(SOURCE),
    ),
    quick={**TRAIN_QUICK, "depth": 4, "warmup": 50},
    full={**TRAIN_FULL, "depth": 6, "warmup": 100},
    measure=measure,
    verdict=verdict,
    headline=headline,
    plot=plot,
    runs=runs,
    notes=(
        "The earlier record (12 layers, lr 1e-2, one setup) had post-norm at chance with and without "
        "warmup, so what warmup does could not show; the setups now name the learning rate (the paper's "
        "and a 10x higher one) and the stack is 6 layers. At the paper's rate (paper-lr, and both "
        "embedding confounds) post-norm trains without warmup: the claim's 'at a high learning rate' is "
        "the condition. At the high rate post-norm without warmup falls to chance while with warmup it "
        "reaches the target, as the claim says, but pre-norm also ends well below its warmup run there, "
        "so 'pre-norm does not need warmup' is not true at that rate on this task. In tokens-0.02 "
        "pre-norm ends at the same low accuracy with or without warmup: the embedding, not the schedule. "
        + EMBEDDING_CHANGE
    ),
)
