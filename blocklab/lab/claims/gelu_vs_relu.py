"""gelu-vs-relu: GELU trains better than ReLU, at a small extra cost.

Held-out accuracy and loss on listops after the same budget, several seeds; the cost is the
median forward+backward time of a GELU FFN over a ReLU one, interleaved in one process.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from matplotlib.figure import Figure

from ...nn.feedforward import FeedForward
from ..grid import RunSpec
from .base import Claim, Numbers, Results, Setup, Source, Verdict, from_checks
from .shared import (
    EMBEDDING_CHANGE,
    TRAIN_FULL,
    TRAIN_QUICK,
    accuracy_axis,
    bars,
    earlier_embedding,
    fin,
    learned_positions,
    pct,
    run_spec,
)

NAME = "gelu-vs-relu"
ACTIVATIONS = ("relu", "gelu")
SMALL_COST = 1.5  # GELU FFN time over ReLU's at most this


def runs(p: dict[str, Any], setup: Setup) -> list[RunSpec]:
    """ReLU and GELU, same budget, several seeds."""
    return [
        run_spec(NAME, setup, f"{act}/s{seed}", p, {"activation": act}, seed=seed)
        for act in ACTIVATIONS
        for seed in range(p["seeds"])
    ]


def ffn_time_ratio(d_model: int = 256, tokens: int = 512, reps: int = 20) -> float:
    """Median forward+backward time of a GELU FFN over a ReLU one, interleaved in one process."""
    torch.manual_seed(0)
    x = torch.randn(tokens, d_model)
    ffns = {act: FeedForward(d_model, 4 * d_model, act) for act in ACTIVATIONS}
    times: dict[str, list[float]] = {act: [] for act in ffns}
    for _ in range(reps):
        for act, ffn in ffns.items():
            start = time.perf_counter()
            ffn(x).sum().backward()
            times[act].append(time.perf_counter() - start)
    return statistics.median(times["gelu"]) / statistics.median(times["relu"])


def measure(p: dict[str, Any], setup: Setup, results: Results) -> Numbers:
    """Accuracy and held-out loss per seed for each activation, and the FFN time ratio."""
    out: dict[str, Any] = {}
    for act in ACTIVATIONS:
        rs = [results[f"{NAME}/{setup.name}/{act}/s{seed}"] for seed in range(p["seeds"])]
        out[act] = {
            "accuracy": [r["accuracy"] for r in rs],
            "eval_loss": [r["eval_loss"] for r in rs],
            "steps_to_target": [r["steps_to_target"] for r in rs],
        }
    out["time_ratio"] = ffn_time_ratio(*p["timing"])
    return out


def _mean(xs: list[float | None]) -> float:
    return sum(fin(x) for x in xs) / len(xs)


def verdict(m: Numbers) -> Verdict:
    """m: {"relu": {"accuracy": [per seed], "eval_loss": [...]}, "gelu": {...}, "time_ratio": gelu/relu}."""
    relu, gelu = m["relu"], m["gelu"]
    # a diverged run's loss is None: it counts as infinitely bad
    loss = lambda xs: statistics.fmean(x if x is not None else float("inf") for x in xs)
    return from_checks(
        [
            (
                f"GELU's mean accuracy ({_mean(gelu['accuracy']):.1%}) is at least ReLU's "
                f"({_mean(relu['accuracy']):.1%})",
                _mean(gelu["accuracy"]) >= _mean(relu["accuracy"]),
            ),
            (
                "GELU's mean held-out loss is at most ReLU's",
                loss(gelu["eval_loss"]) <= loss(relu["eval_loss"]),
            ),
            (
                f"GELU's FFN forward+backward costs at most {SMALL_COST:g}x ReLU's "
                f"(measured {m['time_ratio']:.2f}x)",
                m["time_ratio"] <= SMALL_COST,
            ),
        ]
    )


def headline(m: Numbers) -> str:
    """Accuracy per seed for each activation; the time ratio."""
    relu, gelu = pct(m["relu"]["accuracy"]), pct(m["gelu"]["accuracy"])
    return f"ReLU {relu}, GELU {gelu}, GELU time {m['time_ratio']:.2f}x"


def plot(m: Numbers, fig: Figure) -> None:
    """Accuracy per seed, ReLU next to GELU."""
    ax = fig.subplots()
    seeds = [f"seed {i}" for i in range(len(m["relu"]["accuracy"]))]
    bars(ax, seeds, {"ReLU": m["relu"]["accuracy"], "GELU": m["gelu"]["accuracy"]}, "held-out accuracy")
    accuracy_axis(ax)
    ax.set(title=f"ReLU vs GELU (GELU FFN step time {m['time_ratio']:.2f}x ReLU's)")


SOURCE = Setup("default", "source", "blocklab's listops model with its default embedding and init")

CLAIM = Claim(
    name=NAME,
    kind="training",
    statement="GELU trains better than ReLU, at a small extra cost.",
    source=Source(
        "Hendrycks and Gimpel 2016, 'Gaussian Error Linear Units (GELUs)'",
        "section 3 (experiments)",
        "Across the tasks tried (MNIST, TIMIT, CIFAR-10/100, Twitter POS tagging) GELU matched or beat ReLU "
        "and ELU; tutorials add that the extra cost is small.",
        {
            "depth": "e.g. 8-layer fully connected networks on MNIST",
            "width": "e.g. 128 units (MNIST)",
            "init": "not restated here",
            "positions": "none",
            "lr": "Adam, tuned per task",
            "warmup": "none",
            "steps": "tens of epochs",
        },
    ),
    method="Held-out accuracy and loss on listops after the same budget, several seeds; the cost is the "
    "median "
    "forward+backward time of a GELU FFN over a ReLU one, interleaved in one process.",
    setups=(SOURCE, learned_positions(SOURCE), earlier_embedding(SOURCE)),
    # timing: the FFN the cost is measured on (d_model, tokens, interleaved repetitions)
    quick={**TRAIN_QUICK, "seeds": 2, "timing": [256, 512, 20]},
    full={**TRAIN_FULL, "seeds": 3, "timing": [256, 512, 20]},
    measure=measure,
    verdict=verdict,
    headline=headline,
    plot=plot,
    runs=runs,
    notes=(
        "The earlier record found no gain from GELU on this task, from the default setup alone, at quick "
        "sizes where neither activation trained fully. At full sizes both reach the target in every setup; "
        "GELU's accuracy is a fraction of a point above ReLU's in the default and learned-positions setups, "
        "but its held-out loss is not lower in any setup, so 'trains better' is not shown on this task, "
        "which both learn; its extra cost is small, as the claim says. " + EMBEDDING_CHANGE
    ),
)
