"""layernorm-vs-batchnorm: LayerNorm normalizes each position on its own, so its output does not
depend on the batch or on train/eval mode, and it works at batch size 1; BatchNorm does neither.

One sequence's logits with other batch-mates and in train vs eval mode (at init); then held-out
accuracy of LayerNorm and BatchNorm (norm="batch": statistics over batch and positions, running
statistics in eval) at batch sizes 1, 8 and 64 on listops, 5 seeds, the same 600-step budget.
Padded variable-length batches (listops-padded) are an observation only: blocklab's BatchNorm leaves
the pads out of its statistics (the trainer passes the attention mask), which is not the BatchNorm
the sources measured.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks, seed_count
from .shared import (
    TRAIN_FULL_FAST,
    TRAIN_QUICK,
    accuracy_axis,
    bars,
    fin,
    fresh_model,
    listops_batch,
    median_accuracy,
    outcome,
    per_seed,
    reach_text,
    reached,
    seeded,
    torch_init,
)

NAME = "layernorm-vs-batchnorm"
NORMS = ("standard", "batch")
SAME = 1e-5  # max |logit change| that counts as unchanged
CHANGED = 1e-3  # ... and as changed
WORSE = 0.05  # "does worse": BatchNorm's final accuracy at least this far below LayerNorm's, per seed


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
    return specs


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
    """Invariance of a sequence's output (at init) and accuracy per batch setting for both norms."""
    settings = [str(b) for b in p["batch_sizes"]] + ["padded"]
    label = lambda s: f"b{s}" if s.isdigit() else s
    arms = {
        norm: {s: outcome(per_seed(results, NAME, setup, f"{norm}/{label(s)}", p)) for s in settings}
        for norm in NORMS
    }
    return {"invariance": invariance(p, setup), "arms": arms, "settings": settings}


def verdict(m: Numbers) -> Verdict:
    """m: {"invariance": {norm: {"batch_change", "mode_change"}}, "arms": {norm: {setting: arm}}}.

    Control: LayerNorm at the largest batch size reaches the target on most seeds."""
    inv, arms = m["invariance"], m["arms"]
    ln, bn = arms["standard"], arms["batch"]
    sizes = sorted((s for s in ln if s.isdigit()), key=int)
    smallest, largest = sizes[0], sizes[-1]
    worse, worse_n = seed_count(
        [
            fin(a) - fin(b) >= WORSE
            for a, b in zip(ln[smallest]["accuracy"], bn[smallest]["accuracy"], strict=True)
        ]
    )
    control, control_n = seed_count(reached(ln[largest]))
    padded = "; ".join(
        f"{name} {reach_text(arms[norm]['padded'])}"
        for norm, name in (("standard", "LayerNorm"), ("batch", "BatchNorm"))
    )
    return from_checks(
        [
            (
                "LayerNorm's output for a sequence does not change with the rest of the batch "
                f"(max |diff| < {SAME:g})",
                inv["standard"]["batch_change"] < SAME,
            ),
            (
                f"LayerNorm's output is the same in train and eval mode (max |diff| < {SAME:g})",
                inv["standard"]["mode_change"] < SAME,
            ),
            (
                f"BatchNorm's output changes with the rest of the batch (max |diff| > {CHANGED:g})",
                inv["batch"]["batch_change"] > CHANGED,
            ),
            (
                f"BatchNorm's output differs between train and eval mode (max |diff| > {CHANGED:g})",
                inv["batch"]["mode_change"] > CHANGED,
            ),
            (
                f"at batch size {smallest}, after the same budget, BatchNorm ends at least "
                f"{WORSE * 100:.0f} points below LayerNorm ({worse_n})",
                worse,
            ),
        ],
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
    """Median accuracy by batch setting; how much a sequence's logits change with batch-mates and mode."""
    ax1, ax2 = fig.subplots(1, 2)
    groups = [s if not s.isdigit() else f"batch {s}" for s in m["settings"]]
    series = {"LayerNorm": _medians(m["arms"]["standard"]), "BatchNorm": _medians(m["arms"]["batch"])}
    bars(ax1, groups, series, "held-out accuracy (median over seeds)")
    accuracy_axis(ax1)
    ax1.set(title="accuracy by batch setting")
    inv = m["invariance"]
    changes = {
        "LayerNorm": [
            max(inv["standard"]["batch_change"], 1e-12),
            max(inv["standard"]["mode_change"], 1e-12),
        ],
        "BatchNorm": [inv["batch"]["batch_change"], inv["batch"]["mode_change"]],
    }
    bars(ax2, ["other batch-mates", "train vs eval"], changes, "max |change| of logits")
    ax2.set(yscale="log", title="one sequence's output changes with ...")


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
    statement="LayerNorm normalizes each position on its own, so its output does not depend on the batch or "
    "on train/eval mode, and it works at batch size 1; BatchNorm does neither.",
    source=Source(
        "Ba, Kiros and Hinton 2016, 'Layer Normalization'; Shen et al. 2020, 'PowerNorm: Rethinking Batch "
        "Normalization in Transformers'",
        "Ba et al. sections 1 and 3; Shen et al. section 3",
        "LayerNorm does the same computation at training and test time and works with batch size 1; in NLP "
        "Transformers BatchNorm does worse than LayerNorm because its batch statistics fluctuate.",
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
    method="One sequence's logits with other batch-mates and in train vs eval mode (at init); then "
    "accuracy of "
    "LayerNorm and BatchNorm (norm='batch': statistics over batch and positions, running statistics in eval) "
    "at batch sizes 1, 8 and 64 on listops, 5 seeds, the same 600-step budget; per seed, final accuracy or "
    "steps to 99%. Padded batches (listops-padded) with blocklab's pad-masked BatchNorm are an observation, "
    "not a check: the sources' BatchNorm counts the pads. Scaled down: d_model 64, listops instead of "
    "translation.",
    setups=(
        SOURCE,
        torch_init(SOURCE),
    ),
    quick={**TRAIN_QUICK, "batch": 16, "batch_sizes": [1, 8, 64]},
    full={**TRAIN_FULL_FAST, "batch": 16, "batch_sizes": [1, 8, 64]},
    notes=(
        "The four invariance checks (the rest of the batch, train and eval mode) are exact properties and "
        "hold in both setups. At batch size 1 neither norm reaches the target within the budget, and "
        "BatchNorm ends at least 5 points below LayerNorm on 3 of 5 seeds with Xavier weights (xavier) "
        "and on 4 of 5 with blocklab's init (torch-init): the claim holds in both, by a margin a seed or "
        "two could move with Xavier weights. At batch sizes 8 and 64 both norms reach the target. Padded "
        "batches are an observation: blocklab's BatchNorm leaves the pads out of its statistics, unlike "
        "the sources', and trains on them as well as LayerNorm; the earlier record scored that as the "
        "claim's 'with padding'."
    ),
)
