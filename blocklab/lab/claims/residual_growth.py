"""residual-growth: values grow through the residual stream, and LayerNorm keeps them in range (the block
tutorials).

At initialization, on a listops batch, per seed: log10 of the residual stream's size (the mean L2 norm of
a position's vector) leaving the stack over entering it. Without any norm it beats 0 (the stream grows);
with LayerNorm after each sum (post-norm) it matches 0 (kept in range); the margin is the seed noise of
each stack (null seeds). A pre-norm stack, whose stream is never normalized, is shown beside.
"""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure

from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import compare, exceeds, noise
from .shared import NULL_SEED, diagnose, g2

STACKS: dict[str, dict[str, Any]] = {
    "no norm": {"norm": "none", "norm_position": "pre"},
    "post-norm": {"norm_position": "post"},
    "pre-norm": {"norm_position": "pre"},
}


def growth(p: dict[str, Any], setup: Setup, seed: int, fields: dict[str, Any]) -> list[float]:
    """The stream's mean L2 norm entering each block and leaving the stack."""
    d = diagnose(p, setup, p["batch"], seed, n_layers=p["depth"], **fields)
    return d.profile("resid_norm") + [d.resid_norm_out]


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Per stack: the log10 growth (leaving over entering) per seed and from the null seeds; seed 0's
    profile."""
    out: dict[str, Any] = {"depth": p["depth"]}
    for name, fields in STACKS.items():
        runs = [growth(p, setup, seed, fields) for seed in range(p["seeds"])]
        null = [growth(p, setup, NULL_SEED + s, fields) for s in range(p["seeds"])]
        log_growth = lambda prof: math.log10(prof[-1] / prof[0])
        out[name] = {
            "log10_growth": [log_growth(r) for r in runs],
            "null": [log_growth(r) for r in null],
            "profile": runs[0],
        }
    return out


def verdict(m: Numbers) -> Verdict:
    """Without a norm the stream's log growth beats 0; with post-norm it matches 0."""
    margin = lambda name: noise(
        m[name]["log10_growth"],
        m[name]["null"],
        f"log10 growth of the {name} stack",
        floor=0.01,
        floor_words="a hundredth of a decade",
    )
    plain, post = m["no norm"]["log10_growth"], m["post-norm"]["log10_growth"]
    return from_tests(
        [
            exceeds(
                f"without a norm the residual stream grows over {m['depth']} blocks",
                plain,
                0.0,
                "higher",
                margin("no norm"),
            ),
            compare(
                f"with LayerNorm after each sum (post-norm) it keeps its size over {m['depth']} blocks",
                "matches",
                ([0.0] * len(post), post),
                "higher",
                margin("post-norm"),
            ),
        ],
        observations=[
            f"pre-norm, whose stream no norm touches, grows by "
            f"{g2(10 ** _median(m['pre-norm']['log10_growth']))}x (median): its norms keep each sublayer's "
            "input in range, not the stream"
        ],
    )


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def headline(m: Numbers) -> str:
    """The median growth per stack."""
    return (
        ", ".join(f"{name} x{g2(10 ** _median(m[name]['log10_growth']))}" for name in STACKS)
        + f" over {m['depth']} blocks (median)"
    )


def plot(m: Numbers, fig: Figure) -> None:
    """The stream's size entering each block, seed 0, per stack."""
    ax = fig.subplots()
    for name in STACKS:
        ax.plot(m[name]["profile"], "-o", ms=3, label=name)
    ax.set(
        yscale="log",
        xlabel="block (last: leaving the stack)",
        ylabel="mean ||x||",
        title="the residual stream's size at initialization",
    )
    ax.legend(fontsize="small")


SOURCE = Setup(
    "torch-init", "source", "blocklab's listops model with its default init: the tutorials state none"
)

CLAIM = Claim.of(
    __name__,
    name="residual-growth",
    kind="init",
    statement="Values grow through the residual stream, and LayerNorm keeps them in range.",
    source=Source(
        "the block tutorials this project implements (the layer-normalization tutorial)",
        "why normalize",
        "After the residual sum the values grow (a standard deviation of 2-3 after a few additions); "
        "LayerNorm "
        "brings them back into range.",
        "'grow' and 'keeps in range', read as: the stream's size leaving a 12-block stack over entering it "
        "is "
        "above 1 without any norm, and 1 with LayerNorm after each sum, within the seed noise (log10)",
    ),
    method="At initialization, 5 seeds of a 12-block listops model, 64 sequences: the mean L2 norm of the "
    "residual stream entering the first block and leaving the last, log10 of the ratio, with a 95% t "
    "interval; the margin the seed noise of each stack (5 other seeds). No norm, post-norm (tested), "
    "pre-norm (shown).",
    setups=(
        SOURCE,
        SOURCE.but("xavier", "Xavier block weights", init="xavier"),
        SOURCE.but("he-init", "He et al.'s variance-preserving init: larger branches", init="he"),
    ),
    quick={"d_model": 32, "batch": 16, "depth": 4, "seeds": 2},
    full={"d_model": 64, "batch": 64, "depth": 12, "seeds": 5},
    notes=(
        "The first half holds: without a norm the residual stream grows over 12 blocks in every setup (x2 "
        "with PyTorch's init, x230 with Xavier, x5.8e6 with He weights). The second half, that LayerNorm "
        "keeps it in range, fails as a statement about the stream: in post-norm, where LayerNorm sits on "
        "the stream, the stream shrinks slightly (x0.82, log ratio -0.09 against a 0.016 margin) instead "
        "of keeping its size, and in pre-norm, the layout tutorials draw, no norm touches the stream at "
        "all and it grows by 1.3x to 6.5x. What pre-norm's LayerNorms keep in range is each sublayer's "
        "input, not the stream."
    ),
)
