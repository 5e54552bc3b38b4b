"""How a step is timed on a shared machine, and how two steps' times are compared.

- ``time_rounds``: every step once per round, the order rotating (no step always runs first), so
  load from other processes hits all of them alike.
- Reading the rounds: two steps are compared by their time ratio within each round (both ran under
  the same load); the figure is the median of those ratios (``median_ratio``), its uncertainty a
  percentile bootstrap interval of that median (``Bootstrap``), and a target is decided only when
  the whole interval lies on one side of it (``decide``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


def time_rounds(
    steps: dict[str, Callable[[], None]], rounds: int, min_seconds: float, warmup: int = 1,
    before_round: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each step: one measurement per round (repeating a step for at least
    ``min_seconds``), the order rotating each round; ``before_round`` runs before each round."""
    names = list(steps)
    repeats: dict[str, int] = {}
    for name in names:
        for _ in range(warmup):
            steps[name]()
        t0 = time.perf_counter()
        steps[name]()
        repeats[name] = max(1, math.ceil(min_seconds / max(time.perf_counter() - t0, 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        if before_round is not None:
            before_round()
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(repeats[name]):
                steps[name]()
            times[name].append((time.perf_counter() - t0) / repeats[name])
    return times


# ---- reading the rounds -----------------------------------------------------------------------


def within_round_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """num[r] / den[r] for every round r: each ratio compares two steps timed under the same load."""
    return [n / d for n, d in zip(num, den, strict=True)]


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of num[r] / den[r]."""
    return statistics.median(within_round_ratios(num, den))


def percentile_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """The central ``confidence`` share of ``values``: their (1 - c)/2 and (1 + c)/2 quantiles, linearly
    interpolated between order statistics (numpy's default)."""
    shares = [(1 - confidence) / 2, (1 + confidence) / 2]
    low, high = np.quantile(np.asarray(values, dtype=np.float64), shares)
    return float(low), float(high)


@dataclass(frozen=True)
class Bootstrap:
    """Percentile bootstrap of a median: ``resamples`` seeded draws of n values with replacement from
    the n measured ones; the interval is the central ``confidence`` share of the resamples' medians."""

    confidence: float = 0.95
    resamples: int = 10_000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.confidence < 1:
            raise ValueError(f"Bootstrap.confidence={self.confidence} must be between 0 and 1 (exclusive)")
        if self.resamples < 1:
            raise ValueError(f"Bootstrap.resamples={self.resamples} must be at least 1")

    def medians(self, values: Sequence[float]) -> np.ndarray:
        """The median of every resample, (resamples,)."""
        data = np.asarray(values, dtype=np.float64)
        picks = np.random.default_rng(self.seed).integers(0, len(data), size=(self.resamples, len(data)))
        return np.median(data[picks], axis=1)

    def interval(self, values: Sequence[float]) -> tuple[float, float]:
        """(low, high): the ``confidence`` interval of the median of ``values``."""
        return percentile_interval(self.medians(values), self.confidence)


MET, NOT_MET, UNDECIDED = "met", "not met", "interval too wide to decide"


def decide(low: float, high: float, target: float) -> str:
    """Is a figure >= ``target``? ``met`` when its whole interval is, ``not met`` when none of it is,
    else undecided: the measurement cannot tell."""
    if low >= target:
        return MET
    if high < target:
        return NOT_MET
    return UNDECIDED
