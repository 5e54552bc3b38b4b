"""post-norm-gradient: at init post-norm's FFN gradient grows with the layer index (Xiong et al. 2020);
and the measurement pre-norm-gradient shares.

Gradient norm of each layer's FFN last weight (W2) at init, stacks of the source's width with every token
scored; growth = log10 of the geometric mean over the last third of the layers over that of the first
third, per seed. "Grows" is read as: the growth beats 0 (``exceeds``), at every depth, the margin the
seed noise of the deepest stack.
"""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure

from .base import Claim, Numbers, Results, Setup, Source, Test, Verdict, from_tests
from .rules import compare, exceeds, noise
from .shared import NULL_SEED, diagnose, earlier_embedding, learned_positions


def growth(profile: list[float]) -> float:
    """log10 of the geometric mean of the last third of a per-layer profile over that of the first third."""
    k = max(1, len(profile) // 3)
    log = [math.log10(max(v, 1e-300)) for v in profile]
    return sum(log[-k:]) / k - sum(log[:k]) / k


def measure_position(p: dict[str, Any], setup: Setup, position: str) -> Numbers:
    """Per depth, the growth of the FFN's last weight's (W2) gradient norm over the layers at init, per seed
    (and from the null seeds at the deepest depth), every token scored; the deepest stack's per-layer
    profile (geometric mean over seeds)."""

    def w2(depth: int, seed: int) -> list[float]:
        d = diagnose(p, setup, p["batch"], seed, every_token=True, n_layers=depth, norm_position=position)
        return d.profile("grad_params.ffn.w2")

    per_depth, profile = [], []
    for depth in p["depths"]:
        profiles = [w2(depth, seed) for seed in range(p["seeds"])]
        per_depth.append([growth(prof) for prof in profiles])
        logs = [[math.log10(max(g, 1e-300)) for g in col] for col in zip(*profiles, strict=True)]  # per layer
        profile = [10 ** (sum(col) / len(col)) for col in logs]
    null = [growth(w2(p["depths"][-1], NULL_SEED + s)) for s in range(p["seeds"])]
    return {
        "position": position,
        "depths": p["depths"],
        "growth": per_depth,
        "null_deepest": null,
        "profile": profile,
    }


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """``measure_position`` of post-norm."""
    return measure_position(p, setup, "post")


def growth_tests(m: Numbers, word: str, says: str) -> list[Test]:
    """``word`` ("beats": the growth is above 0; "matches": it is 0) at each depth, the margin the seed
    noise of the deepest stack's growth."""
    margin = noise(
        m["growth"][-1],
        m["null_deepest"],
        f"log10 growth at depth {m['depths'][-1]}",
        floor=0.01,
        floor_words="a hundredth of a decade",
    )
    return [
        exceeds(f"{m['position']}-norm's W2 gradient {says} at depth {depth}", g, 0.0, "higher", margin)
        if word == "beats"
        else compare(
            f"{m['position']}-norm's W2 gradient {says} at depth {depth}",
            "matches",
            ([0.0] * len(g), g),
            "higher",
            margin,
        )
        for depth, g in zip(m["depths"], m["growth"], strict=True)
    ]


def verdict(m: Numbers) -> Verdict:
    """m: ``measure_position``'s: the growth beats 0 at every depth."""
    return from_tests(growth_tests(m, "beats", "grows from the first third of the layers to the last"))


def _median_growth(per_seed: list[list[float]]) -> list[float]:
    """Per depth, the median (log10) growth over seeds."""
    return [sorted(col)[len(col) // 2] for col in per_seed]


def headline(m: Numbers) -> str:
    """Growth (last third / first third) per depth, the median over seeds."""
    fmt = " ".join(f"{10**x:.2f}" for x in _median_growth(m["growth"]))
    return f"{m['position']}-norm growth at depth {' '.join(map(str, m['depths']))}: {fmt} (medians)"


def plot(m: Numbers, fig: Figure) -> None:
    """The per-layer profile at the deepest depth; growth against depth."""
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(range(1, len(m["profile"]) + 1), m["profile"], "-o", ms=3, label=f"{m['position']}-norm")
    ax1.set(yscale="log", xlabel="layer", ylabel="|grad FFN W2|", title=f"per layer, depth {m['depths'][-1]}")
    ax1.legend(fontsize="x-small")
    ax2.plot(m["depths"], [10**x for x in _median_growth(m["growth"])], "-o", label="median over seeds")
    for depth, g in zip(m["depths"], m["growth"], strict=True):
        ax2.plot([depth] * len(g), [10**x for x in g], ".", color="grey", alpha=0.6)
    ax2.axhline(1.0, color="green", lw=0.8, ls=":")
    ax2.set(yscale="log", xlabel="depth", ylabel="last third / first third", title="growth with layer index")
    ax2.legend(fontsize="x-small")


XAVIER = Setup("xavier", "source", "Xavier-normal block weights, as in the paper's theorem", init="xavier")

CLAIM = Claim.of(
    __name__,
    name="post-norm-gradient",
    kind="init",
    statement="At initialization the gradient of post-norm's FFN weights grows with the layer index.",
    source=Source(
        "Xiong et al. 2020, 'On Layer Normalization in the Transformer Architecture'",
        "section 3.2 (Theorem 1) and section 3.3 (Figure 3)",
        "At initialization the gradient of the FFN's last weight is large near the output for Post-LN "
        "and independent of the layer for Pre-LN; Figure 3 shows the gradient norm increasing with the "
        "layer index for Post-LN and staying the same for Pre-LN.",
        "'increasing with the layer index' for Post-LN, read as: the last third of the layers' W2 gradient "
        "norm over the first third's is above 1 (log above 0) beyond the seed noise, at every depth",
        {
            "depth": "6 encoder and 6 decoder layers (Figure 3)",
            "width": "d_model 512 (IWSLT14 De-En Transformer)",
            "init": "Xavier (the theorem's assumption)",
            "positions": "sinusoidal, token embeddings scaled by sqrt(d_model) (Vaswani et al.)",
            "lr": "none: measured at initialization",
            "warmup": "none: measured at initialization",
            "steps": "0 (initialization)",
        },
    ),
    method="Gradient norm of each layer's FFN last weight (W2) at init, post-norm stacks of 6, 12 and 24 "
    "layers at the source's width (d_model 512), causal, every token scored (64 listops sequences, each "
    "position predicting the next token); growth = geometric mean of the last third of the layers over the "
    "first third, per seed (5), against 1 with a 95% t interval; the margin the seed noise of depth 24 "
    "(5 other seeds).",
    setups=(
        XAVIER,
        XAVIER.but(
            "default-init",
            "GPT-2's N(0, 0.02) block weights (near Xavier's 0.028 at this width)",
            init="default",
        ),
        learned_positions(XAVIER),
        earlier_embedding(XAVIER),
    ),
    quick={"d_model": 64, "batch": 32, "depths": [6], "seeds": 2},
    full={"d_model": 512, "batch": 64, "depths": [6, 12, 24], "seeds": 5},
    notes=(
        "With Xavier weights (Xiong et al.'s setting) post-norm's W2 gradient is larger in the last third "
        "of the layers than in the first at every depth: the ratio (medians) is 1.09 at 6 layers, 1.40 at "
        "12 and 1.53 at 24, the paired log ratios +0.04, +0.15 and +0.17 all above zero by more than the "
        "seed noise allows: holds, robust. With GPT-2's init the growth is smaller (1.04, 1.12, 1.16) and "
        "at 6 layers within the noise, so that setup fails; with small token embeddings (0.02) none of "
        "the three depths grows beyond the noise (1.03 to 1.32, intervals reaching below zero). Learned "
        "positions keep it (1.09 to 1.28). The growth Xiong et al. derive is real in their setting and "
        "shrinks with smaller initial weights."
    ),
)
