"""ffn-share: the FFN holds about 60% of a model's parameters (the block tutorials).

Exact: the parameters of each preset's FFNs over its total, counted by ``count_parameters``. "~60%" is a
figure stated to one significant digit: it holds for a model whose share rounds to it, 55% to 65%.
The test reads GPT-2 small (the tutorials' model) and GPT-3 175B (the other end of the family); the
share of the blocks' parameters alone, and every other preset, are shown beside.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from ...nn.params import count_parameters
from ...nn.presets import PRESETS, preset
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_tests
from .rules import exact

STATED = 0.60
PRECISION = 0.05  # one significant digit: what rounds to 60%
TESTED = ("gpt2", "gpt3-175b")


def shares(name: str) -> dict[str, float]:
    """The FFNs' parameters over all of a preset's, and over its blocks'."""
    parts = count_parameters(preset(name)).components
    blocks = sum(v for k, v in parts.items() if k.startswith("blocks."))
    return {"of_all": parts["blocks.ffn"] / sum(parts.values()), "of_blocks": parts["blocks.ffn"] / blocks}


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """``shares`` of every preset."""
    return {"presets": {name: shares(name) for name in PRESETS}, "tested": list(TESTED)}


def verdict(m: Numbers) -> Verdict:
    """The tested presets' FFN share of all parameters is 60% to the figure's precision."""
    presets = m["presets"]
    tests = [
        exact(
            f"{name}: the FFNs hold about 60% of all parameters ({presets[name]['of_all']:.1%})",
            [presets[name]["of_all"]],
            [STATED],
            PRECISION,
            absolute=True,
        )
        for name in m["tested"]
    ]
    return from_tests(
        tests,
        observations=[
            "of the blocks' parameters alone: "
            + ", ".join(f"{n} {s['of_blocks']:.1%}" for n, s in presets.items()),
            "of all parameters, every preset: "
            + ", ".join(f"{n} {s['of_all']:.1%}" for n, s in presets.items()),
        ],
    )


def headline(m: Numbers) -> str:
    """The tested presets' shares."""
    return "; ".join(
        f"{n}: {m['presets'][n]['of_all']:.1%} of all, {m['presets'][n]['of_blocks']:.1%} of the blocks"
        for n in m["tested"]
    )


def plot(m: Numbers, fig: Figure) -> None:
    """The share per preset, of all parameters and of the blocks'."""
    ax = fig.subplots()
    names = list(m["presets"])
    ax.barh(names, [m["presets"][n]["of_all"] for n in names], label="of all parameters")
    ax.plot([m["presets"][n]["of_blocks"] for n in names], names, "k|", ms=12, label="of the blocks'")
    ax.axvspan(STATED - PRECISION, STATED + PRECISION, color="green", alpha=0.1, label="rounds to 60%")
    ax.set(xlim=(0, 1), xlabel="FFN parameters / parameters", title="the FFN's share")
    ax.legend(fontsize="small")


CLAIM = Claim.of(
    __name__,
    name="ffn-share",
    kind="exact",
    statement="The FFN holds about 60% of all model parameters.",
    source=Source(
        "the block tutorials this project implements (the feed-forward network tutorial)",
        "why the FFN matters",
        "The FFN layers contain ~60% of all model parameters.",
        "'~60% of all model parameters', a figure of one significant digit, read as: the share rounds to 60% "
        "(55% to 65%), for GPT-2 small and GPT-3 175B",
    ),
    method="The parameters of each preset's FFNs (both matrices and biases, every block) over its total, "
    "counted by blocklab's count_parameters (exact against the published GPT-2 figure: param-counts).",
    setups=(Setup("exact", "exact", "counting: nothing about it can be confounded"),),
    quick={},
    full={},
)
