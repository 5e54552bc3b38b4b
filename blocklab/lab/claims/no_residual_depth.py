"""no-residual-depth: without residual connections deeper stacks train worse, while residual stacks of
the same depths train (He et al.'s degradation problem).

Train listops with residual none and add at several depths (pre-norm, so only the residual
differs), 3 seeds; final accuracy within the same budget. The first block's gradient at init, with
and without residuals, is an observation: the source says its plain nets' trouble is not vanishing
gradients, and the claim does not rest on it.
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
    bars,
    curves,
    diagnose,
    fin,
    g2,
    median_accuracy,
    outcome,
    pct,
    per_seed,
    seeded,
    torch_init,
    trains,
)

NAME = "no-residual-depth"
RESIDUALS = ("add", "none")


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """residual add vs none at each depth, each seed."""
    return [
        spec
        for res in RESIDUALS
        for depth in p["depths"]
        for spec in seeded(
            NAME, setup, f"{res}/L{depth}", p, {"residual": res, "n_layers": depth, "norm_position": "pre"}
        )
    ]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per depth and seed, with and without residuals: final accuracy, steps to target; the first
    block's FFN weight gradient at init (seed 0); seed 0's curves."""
    arms = {
        res: [outcome(per_seed(results, NAME, setup, f"{res}/L{d}", p)) for d in p["depths"]]
        for res in RESIDUALS
    }
    grad = {
        res: [
            diagnose(p, setup, 64, 0, residual=res, n_layers=d, norm_position="pre").profile(
                "grad_params.ffn.w1"
            )[0]
            for d in p["depths"]
        ]
        for res in RESIDUALS
    }
    return {
        "depths": p["depths"],
        **arms,
        "first_block_grad": grad,
        "trains_at": p["trains_at"],
        "fails_below": p["fails_below"],
        "curves": {
            f"{res} L{d}": per_seed(results, NAME, setup, f"{res}/L{d}", p)[0]["curve"]
            for res in RESIDUALS
            for d in p["depths"]
        },
    }


def verdict(m: Numbers) -> Verdict:
    """m: {"depths", "add": [arm per depth], "none": [...], "first_block_grad", "trains_at", "fails_below"}.

    Control: without residuals the shallowest stack trains on most seeds (the task and setup are fine).
    Checks: with residuals every depth trains; without, the deepest does not, and ends below the
    shallowest seed by seed (accuracy falls with depth)."""
    depths, add, none = m["depths"], m["add"], m["none"]
    at, below = m["trains_at"], m["fails_below"]
    residual_ok = [seed_count(trains(arm, at)) for arm in add]
    deep_fails, deep_n = seed_count([fin(a) < below for a in none[-1]["accuracy"]])
    degrades, degrades_n = seed_count(
        [fin(d) < fin(s) for d, s in zip(none[-1]["accuracy"], none[0]["accuracy"], strict=True)]
    )
    shallow, shallow_n = seed_count(trains(none[0], at))
    grad = m["first_block_grad"]
    return from_checks(
        [
            (
                f"with residuals every depth trains (accuracy >= {at:.0%}; "
                + ", ".join(f"depth {d}: {n}" for d, (_, n) in zip(depths, residual_ok, strict=True))
                + ")",
                all(ok for ok, _ in residual_ok),
            ),
            (
                f"without residuals depth {depths[-1]} fails to train (accuracy < {below:.0%}; {deep_n})",
                deep_fails,
            ),
            (
                f"without residuals depth {depths[-1]} ends below depth {depths[0]}, "
                f"seed by seed ({degrades_n})",
                degrades,
            ),
        ],
        controls=[
            (f"without residuals depth {depths[0]} trains (accuracy >= {at:.0%}; {shallow_n})", shallow)
        ],
        observations=[
            "first block's FFN W1 gradient norm at init, depth " + " ".join(map(str, depths)) + ": with "
            f"residuals {' '.join(g2(g) for g in grad['add'])}, "
            f"without {' '.join(g2(g) for g in grad['none'])} "
            "(seed 0; the claim does not rest on it)"
        ],
    )


def headline(m: Numbers) -> str:
    """Median final accuracy over seeds per depth, with and without residuals."""
    med = lambda arms: pct([median_accuracy(arm) for arm in arms])
    return "depth {}: add {}, none {} (medians of {} seeds)".format(
        " ".join(map(str, m["depths"])), med(m["add"]), med(m["none"]), len(m["add"][0]["accuracy"])
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Accuracy at the budget per depth; held-out accuracy during training."""
    ax1, ax2 = fig.subplots(1, 2)
    bars(
        ax1,
        [f"L={d}" for d in m["depths"]],
        {
            "residual add": [median_accuracy(a) for a in m["add"]],
            "residual none": [median_accuracy(a) for a in m["none"]],
        },
        "held-out accuracy (median over seeds)",
    )
    accuracy_axis(ax1)
    ax1.set(title="accuracy within a fixed budget")
    curves(ax2, m["curves"])
    ax2.set(title="held-out accuracy during training (seed 0)")


SOURCE = Setup(
    "he-init", "source", "blocklab's listops model (pre-norm) with He et al.'s init, the source's", init="he"
)

CLAIM = Claim.of(
    __name__,
    name=NAME,
    kind="training",
    statement="Without residual connections deeper stacks train worse, and a 20-layer one fails to train, "
    "while residual stacks of the same depths train.",
    source=Source(
        "He, Zhang, Ren and Sun 2016, 'Deep Residual Learning for Image Recognition'",
        "section 4.2 (CIFAR-10) and Figure 1",
        "Plain (residual-free) networks degrade with depth: the 56-layer plain net has higher training error "
        "than the 20-layer one, while residual nets of the same depths improve.",
        {
            "depth": "20, 32, 44, 56 (plain and residual)",
            "width": "16, 32, 64 filters",
            "init": "He et al. 2015, with batch normalization",
            "positions": "none (images)",
            "lr": "SGD, 0.1 divided by 10 at 32k and 48k iterations",
            "warmup": "none (0.01 for the first ~400 iterations of the 110-layer net only)",
            "steps": "64k iterations, batch 128",
        },
    ),
    method="Train listops with residual none and add at depths 2, 10 and 20 (pre-norm, so only the residual "
    "differs), 3 seeds; final accuracy within the same 600-step budget (a run stops at 99%). Scaled down: "
    "d_model 64 and listops instead of CIFAR-10 convolutional nets; the first block's gradient at init is "
    "an observation.",
    setups=(
        SOURCE,
        torch_init(SOURCE),
    ),
    quick={**TRAIN_QUICK, "depths": [2, 6, 12], "trains_at": 0.3, "fails_below": 0.15},
    full={**TRAIN_FULL, "depths": [2, 10, 20], "trains_at": 0.9, "fails_below": 0.5},
    notes=(
        "With residuals, stacks of 2, 10 and 20 layers reach the target on every seed in both setups "
        "(he-init, the source's init, and torch-init); without residuals the 2-layer stack trains (the "
        "control) while the 10- and 20-layer stacks stay at chance on every seed: deeper plain stacks "
        "train worse, as He et al. say, here in the starkest form. The first block's gradient at init, an "
        "observation, is not smaller without residuals than with them at any depth in either setup: the "
        "plain stacks fail with gradients of ordinary size, as He et al. say of their own plain nets. The "
        "earlier statement, that the 10-layer stack's gradients vanish, was never measured and is not "
        "what these numbers show; the claim no longer says it."
    ),
)
