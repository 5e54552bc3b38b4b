"""layernorm-vs-batchnorm: LayerNorm works with batch size 1; BatchNorm does worse (Ba et al. 2016, Shen
et al. 2020). The invariances behind it are layernorm-invariance's, an exact claim.

Held-out accuracy of LayerNorm and BatchNorm (norm="batch": statistics over batch and positions,
running statistics in eval) at batch sizes 1, 8 and 64 on listops, 5 seeds, the same 600-step budget.
At batch size 1: LayerNorm trains clearly above chance (``exceeds`` chance + 10 points) and beats
BatchNorm, paired by seed; the margin is the seed noise of LayerNorm at batch size 1 (a null arm).
Padded variable-length batches (listops-padded) are an observation only: blocklab's BatchNorm leaves
the pads out of its statistics (the trainer passes the attention mask), which is not the BatchNorm
the sources measured.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests, seed_count
from .rules import exceeds
from .shared import (
    CHANCE,
    TRAIN_FULL,
    TRAIN_QUICK,
    accuracy_axis,
    arms_test,
    bars,
    median_accuracy,
    null_margin,
    outcome,
    per_seed,
    reach_text,
    reached,
    reading,
    seeded,
    torch_init,
)

NAME = "layernorm-vs-batchnorm"
NORMS = ("standard", "batch")
CLEARLY = 0.1  # "works": held-out accuracy above chance by more than this (10 points)


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """LayerNorm and BatchNorm at each batch size on listops, and on padded listops-padded batches."""
    specs = [
        spec
        for norm in NORMS
        for b in p["batch_sizes"]
        for spec in seeded(NAME, setup, f"{norm}/b{b}", p, {"norm": norm}, batch_size=b)
    ]
    specs += [
        spec
        for norm in NORMS
        for spec in seeded(NAME, setup, f"{norm}/padded", p, {"norm": norm}, task="listops-padded")
    ]
    smallest = min(p["batch_sizes"])
    return specs + seeded(
        NAME, setup, f"standard/b{smallest}", p, {"norm": "standard"}, null=True, batch_size=smallest
    )


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Accuracy per batch setting for both norms; LayerNorm's at the smallest batch from the null seeds."""
    settings = [str(b) for b in p["batch_sizes"]] + ["padded"]
    label = lambda s: f"b{s}" if s.isdigit() else s
    arms = {
        norm: {s: outcome(per_seed(results, NAME, setup, f"{norm}/{label(s)}", p)) for s in settings}
        for norm in NORMS
    }
    smallest = min(p["batch_sizes"])
    null = outcome(per_seed(results, NAME, setup, f"standard/b{smallest}", p, null=True))
    return {"arms": arms, "null": null, "settings": settings}


def verdict(m: Numbers) -> Verdict:
    """m: {"arms": {norm: {setting: arm}}, "null": LayerNorm's null arm at the smallest batch size}.

    Control: LayerNorm at the largest batch size reaches the target on most seeds. Tests at the smallest
    batch size: LayerNorm's held-out accuracy beats chance + CLEARLY; it beats BatchNorm's, paired by
    seed."""
    arms = m["arms"]
    ln, bn = arms["standard"], arms["batch"]
    sizes = sorted((s for s in ln if s.isdigit()), key=int)
    smallest, largest = sizes[0], sizes[-1]
    margin = null_margin(
        ln[smallest], m["null"], "accuracy", f"LayerNorm's held-out accuracy at batch size {smallest}"
    )
    final, alt = reading(ln[smallest], "accuracy")
    tests = [
        exceeds(
            f"LayerNorm works at batch size {smallest}: its held-out accuracy is more than "
            f"{CLEARLY * 100:.0f} points above chance",
            final,
            CHANCE + CLEARLY,
            "higher",
            margin,
            alt,
        ),
        arms_test(
            f"at batch size {smallest} LayerNorm's held-out accuracy beats BatchNorm's",
            "beats",
            bn[smallest],
            ln[smallest],
            "accuracy",
            "higher",
            margin,
        ),
    ]
    control, control_n = seed_count(reached(ln[largest]))
    padded = "; ".join(
        f"{name} {reach_text(arms[norm]['padded'])}"
        for norm, name in (("standard", "LayerNorm"), ("batch", "BatchNorm"))
    )
    return from_tests(
        tests,
        controls=[(f"LayerNorm at batch size {largest} reaches the target ({control_n})", control)],
        observations=[
            f"padded variable-length batches with blocklab's pad-masked BatchNorm (not the sources' "
            f"BatchNorm, which counts pads): {padded} (seeds reaching the target, median steps)"
        ],
    )


def _medians(arms: dict[str, dict[str, Any]]) -> list[float]:
    """Per setting, the median final accuracy over seeds (a diverged run as 0)."""
    return [median_accuracy(arm) for arm in arms.values()]


def headline(m: Numbers) -> str:
    """Per batch setting, seeds reaching the target (median steps, or median accuracy), both norms."""
    arms = m["arms"]
    return "batch {}: LN {}; BN {}".format(
        " ".join(m["settings"]),
        ", ".join(reach_text(a) for a in arms["standard"].values()),
        ", ".join(reach_text(a) for a in arms["batch"].values()),
    )


def plot(m: Numbers, fig: Figure) -> None:
    """Median accuracy by batch setting."""
    ax = fig.subplots()
    groups = [s if not s.isdigit() else f"batch {s}" for s in m["settings"]]
    series = {"LayerNorm": _medians(m["arms"]["standard"]), "BatchNorm": _medians(m["arms"]["batch"])}
    bars(ax, groups, series, "held-out accuracy (median over seeds)")
    accuracy_axis(ax)
    ax.set(title="accuracy by batch setting")


SOURCE = Setup(
    "xavier",
    "source",
    "blocklab's listops model (post-norm, as fairseq's Transformer the sources trained) with Xavier "
    "block weights (fairseq's init)",
    init="xavier",
)

CLAIM = Claim.of(
    __name__,
    name=NAME,
    kind="training",
    statement="LayerNorm works with batch size 1, where BatchNorm does worse.",
    source=Source(
        "Ba, Kiros and Hinton 2016, 'Layer Normalization'; Shen et al. 2020, 'PowerNorm: Rethinking Batch "
        "Normalization in Transformers'",
        "Ba et al. sections 1 and 3; Shen et al. section 3",
        "LayerNorm does the same computation at training and test time and works with batch size 1; in NLP "
        "Transformers BatchNorm does worse than LayerNorm because its batch statistics fluctuate.",
        "'works with batch size 1', read as: at batch size 1 LayerNorm's held-out accuracy is more than 10 "
        "points above chance and beats BatchNorm's, paired by seed, beyond LayerNorm's seed noise",
        {
            "depth": "Shen et al.: Transformer-base/big (6 layers)",
            "width": "d_model 512 / 1024",
            "init": "Xavier (fairseq's Transformer)",
            "positions": "sinusoidal",
            "lr": "Adam with warmup (fairseq's recipes)",
            "warmup": "yes",
            "steps": "IWSLT14 / WMT14 translation to convergence",
        },
    ),
    method="Held-out accuracy of LayerNorm and BatchNorm (norm='batch': statistics over batch and positions, "
    "running statistics in eval) at batch sizes 1, 8 and 64 on listops, 5 seeds, the same 600-step budget; "
    "at "
    "batch size 1, LayerNorm against chance + 10 points and against BatchNorm, paired by seed with a 95% t "
    "interval, the margin the seed noise of LayerNorm at batch size 1 (5 other seeds). Padded batches "
    "(listops-padded) with blocklab's pad-masked BatchNorm are an observation: the sources' BatchNorm counts "
    "the pads. Scaled down: d_model 64, listops instead of translation.",
    setups=(
        SOURCE,
        torch_init(SOURCE),
    ),
    quick={**TRAIN_QUICK, "batch_sizes": [1, 64]},
    full={**TRAIN_FULL, "batch_sizes": [1, 8, 64]},
    notes=(
        "At batch size 1 neither norm reaches 99% held-out within the budget, on 0 of 5 seeds each. "
        "LayerNorm works there in the claim's sense: 44% held-out with Xavier weights, 22 points above "
        "chance (interval +0.11 .. +0.32, more than the 0.18 seed noise). But BatchNorm, which at batch 1 "
        "normalises each feature over the sequence's positions, reaches 38%, and LayerNorm's lead of 7 "
        "points has an interval (-0.015 .. +0.159) that does not clear the margin: 'does worse' fails in "
        "the source setup (fragile: at half the margin it is inconclusive). With PyTorch's init the lead "
        "is 13 points (-0.027 .. +0.281): inconclusive. At batch 8 and 64 both reach the target "
        "(BatchNorm at 375 and 100 steps, LayerNorm at 400 and 125), and with padded batches under "
        "blocklab's pad-masked BatchNorm both do too (275 and 300 steps)."
    ),
)
