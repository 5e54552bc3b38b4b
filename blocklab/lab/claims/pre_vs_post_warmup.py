"""pre-vs-post-warmup: post-norm needs learning-rate warmup at a high learning rate; pre-norm does not.

Train post- and pre-norm stacks at a high peak learning rate with linear warmup and without
(warmup 0), several seeds; whether each run reaches the target within the same budget.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks, seed_count
from .shared import (
    TRAIN_FULL,
    TRAIN_QUICK,
    curves,
    outcome,
    per_seed,
    reach_text,
    reached,
    seeded,
)

NAME = "pre-vs-post-warmup"
POSITIONS = ("post", "pre")
SCHEDULES = ("warmup", "no_warmup")


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """Post- and pre-norm with and without warmup, at the setup's learning rate, each seed."""
    return [
        spec
        for pos in POSITIONS
        for sched in SCHEDULES
        for spec in seeded(
            NAME,
            setup,
            f"{pos}/{sched}",
            p,
            {"norm_position": pos, "n_layers": p["depth"]},
            warmup=p["warmup"] if sched == "warmup" else 0,
        )
    ]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per arm (position x schedule) and seed: final accuracy, steps to target, divergence; seed 0's
    curves."""
    lr = setup.train.get("lr", p["lr"])
    out: dict[str, Any] = {"lr": lr, "warmup_steps": p["warmup"], "depth": p["depth"], "curves": {}}
    for pos in POSITIONS:
        out[pos] = {}
        for sched in SCHEDULES:
            rs = per_seed(results, NAME, setup, f"{pos}/{sched}", p)
            out[pos][sched] = outcome(rs)
            out["curves"][f"{pos}-norm, {sched.replace('_', ' ')}"] = rs[0]["curve"]
    return out


def verdict(m: Numbers) -> Verdict:
    """m: {"lr", "post": {"warmup": arm, "no_warmup": arm}, "pre": {...}} (arms: ``shared.outcome``).

    Control: post-norm *with* warmup reaches the target on most seeds (else the setup cannot show what
    warmup does). Checks: post-norm without warmup fails to reach it on most seeds; pre-norm without
    warmup reaches it on most seeds."""
    post, pre = m["post"], m["pre"]
    control, control_n = seed_count(reached(post["warmup"]))
    post_fails, post_n = seed_count([not r for r in reached(post["no_warmup"])])
    pre_trains, pre_n = seed_count(reached(pre["no_warmup"]))
    return from_checks(
        [
            (f"at lr {m['lr']:g} post-norm without warmup does not reach the target ({post_n})", post_fails),
            (f"at lr {m['lr']:g} pre-norm without warmup reaches the target ({pre_n})", pre_trains),
        ],
        controls=[(f"post-norm with warmup reaches the target ({control_n})", control)],
        observations=[
            f"pre-norm with warmup: {reach_text(pre['warmup'])} (seeds reaching the target, median steps)"
        ],
    )


def headline(m: Numbers) -> str:
    """Seeds reaching the target (median steps) with and without warmup, post and pre."""
    post, pre = m["post"], m["pre"]
    return (
        f"lr {m['lr']:g}: post {reach_text(post['warmup'])} / {reach_text(post['no_warmup'])}, "
        f"pre {reach_text(pre['warmup'])} / {reach_text(pre['no_warmup'])} (warmup / none)"
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Held-out accuracy during training, the four arms (seed 0)."""
    ax = fig.subplots()
    curves(ax, m["curves"])
    ax.set(title=f"lr {m['lr']:g}, {m['depth']} layers, warmup {m['warmup_steps']} steps or none (seed 0)")


SOURCE = Setup(
    "high-lr",
    "source",
    "the claim's condition, a high peak learning rate (1e-2, 10x the paper's largest at this small "
    "width), with the paper's Xavier init",
    train={"lr": 1e-2},
    init="xavier",
)

CLAIM = Claim.of(
    __name__,
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
    method="Train post- and pre-norm stacks of the source's depth at a high peak learning rate with linear "
    "warmup and without (warmup 0), 3 seeds each; per seed, whether the run reaches 99% held-out within "
    "the same 600-step budget. Scaled down: d_model 64 instead of 512, listops instead of translation.",
    setups=(
        SOURCE,
        SOURCE.but(
            "torch-init",
            "blocklab's default init (PyTorch's nn.Linear variance) instead of Xavier",
            init="torch",
        ),
        SOURCE.but(
            "default-init",
            "GPT-2's N(0, 0.02) block weights, the earlier record's init and the independent reproduction's "
            "(issue 25): small branches, so every block starts near the identity",
            init="default",
        ),
    ),
    quick={**TRAIN_QUICK, "depth": 4, "warmup": 50},
    full={**TRAIN_FULL, "depth": 6, "warmup": 100},
    notes=(
        "At the claim's high learning rate, post-norm without warmup stays at chance on every seed in "
        "every setup. Whether warmup rescues it depends on the init: with GPT-2's N(0, 0.02) weights "
        "(default-init) post-norm with warmup reaches the target on every seed, the claim's first half; "
        "with Xavier weights (high-lr, the source's init) or blocklab's (torch-init) post-norm misses the "
        "target on most seeds even with 100 steps of warmup, so those setups cannot show what warmup does "
        "and are inconclusive. Pre-norm without warmup reaches the target on every seed with Xavier "
        "weights, but on only 1 of 3 with GPT-2's init, where the other two end below it within the "
        "budget: in the one conclusive setup the second half is not shown, so the claim is partly. The "
        "earlier record's source setup ran at the paper's 1e-3, outside the claim's own condition; every "
        "setup here is at 1e-2."
    ),
)
