"""The lab's statistics: a comparison over seeds is a paired effect with a 95% interval, and each word a
claim may use ("beats", "matches", "needs") has one rule, the same in every claim.

Two arms, A and B, are run with the same seeds: seed s gives both the same data order (and the same
init where the shapes allow), so the per-seed differences d_s = B_s - A_s carry the comparison and the
spread the two arms share cancels. The effect is their mean with a two-sided interval: Student's t
(``interval="t"``, the default) or a percentile bootstrap of the mean (``"bootstrap"``, scipy's, with a
fixed seed so the record is reproducible).

The words, with ``better`` saying which way is better for the measured number ("lower": a loss, steps
to a target; "higher": an accuracy):

    beats    B beats A:  the interval excludes 0 on B's side. It fails when the interval excludes 0 on
             A's side, or lies inside the margin (no difference worth the word); otherwise it is
             inconclusive (too few seeds, or too noisy, to say).
    matches  B performs like A: the interval lies inside [-margin, +margin]. It fails when the whole
             interval lies outside the margin; otherwise it is inconclusive.
    at least B matches or beats A (non-inferiority): the interval's worse end lies within the margin. It
             fails when the whole interval lies beyond the margin on A's side; otherwise inconclusive.
    needs    B needs X (a dose-response): B beats A under X, and matches A without X. It fails when B
             does not beat A under X, or beats A without X too; otherwise it is inconclusive.

Every margin states where it comes from (``Margin.origin``): the source's own words, or the measured
seed noise of identical runs (``noise_margin``: two arms with the same settings and different seeds,
the largest difference their interval admits). ``sensitivity`` recomputes a verdict under neighbouring
choices (the margin halved and doubled, another budget, one evaluation more or less) and labels it
robust or fragile.

Torch-free, and free of the claims: they call it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

INTERVALS = ("t", "bootstrap")
DIRECTIONS = ("lower", "higher")  # which way is better for the measured number
MARGIN_ORIGINS = ("source", "seed noise")
OUTCOMES = ("holds", "fails", "inconclusive")
CONFIDENCE = 0.95
MIN_SEEDS = 2  # an interval needs two differences; the lab's claims run at least 5
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Effect:
    """The paired effect of B over A: the mean per-seed difference B - A and its interval."""

    mean: float
    low: float
    high: float
    n: int  # seeds (pairs)
    interval: str  # "t" or "bootstrap"
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    def __str__(self) -> str:
        percent = f"{self.confidence:.0%}"
        return (
            f"{self.mean:+.4g} ({percent} {self.interval} interval {self.low:+.4g} .. {self.high:+.4g}, "
            f"{self.n} seeds)"
        )


@dataclass(frozen=True)
class Margin:
    """An equivalence margin in the measured number's unit, and where it comes from."""

    value: float
    origin: str  # one of MARGIN_ORIGINS
    text: str  # the source's words, or how the noise was measured

    def __post_init__(self) -> None:
        if not (isinstance(self.value, (int, float)) and math.isfinite(self.value) and self.value > 0):
            raise ValueError(f"Margin.value={self.value!r} must be a finite number above 0")
        if self.origin not in MARGIN_ORIGINS:
            raise ValueError(f"Margin.origin={self.origin!r} is not one of: {', '.join(MARGIN_ORIGINS)}")
        if not self.text.strip():
            raise ValueError(
                "Margin.text is empty: quote the source's words or say how the noise was measured"
            )

    def scaled(self, factor: float) -> Margin:
        """The same margin times ``factor`` (the sensitivity's neighbours)."""
        return Margin(self.value * factor, self.origin, f"{self.text} (x{factor:g})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _checked_pairs(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """The per-seed differences b - a; a ValueError for unpaired, too few or non-finite numbers."""
    if len(a) != len(b):
        raise ValueError(f"paired arms need one number per seed in each: got {len(a)} and {len(b)}")
    if len(a) < MIN_SEEDS:
        raise ValueError(f"an interval needs at least {MIN_SEEDS} seeds, got {len(a)}")
    values = [float(x) for x in (*a, *b)]
    if not all(math.isfinite(x) for x in values):
        raise ValueError(
            "a per-seed number is not finite: record a diverged run as the claim's own rule says"
        )
    return [float(y) - float(x) for x, y in zip(a, b, strict=True)]


def paired_effect(
    a: Sequence[float], b: Sequence[float], interval: str = "t", confidence: float = CONFIDENCE
) -> Effect:
    """The mean of b_s - a_s over seeds s with its two-sided ``confidence`` interval (Student's t on the
    differences, or a percentile bootstrap of their mean)."""
    from scipy import stats

    if interval not in INTERVALS:
        raise ValueError(f"interval={interval!r} is not one of: {', '.join(INTERVALS)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} must lie in (0, 1)")
    d = _checked_pairs(a, b)
    n = len(d)
    mean = math.fsum(d) / n
    if all(x == d[0] for x in d):  # no spread: the interval is the point (t and bootstrap both degenerate)
        return Effect(mean, mean, mean, n, interval, confidence)
    if interval == "t":
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        return Effect(mean, mean - half, mean + half, n, interval, confidence)
    result = stats.bootstrap(
        (d,),
        _mean,
        confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        random_state=BOOTSTRAP_SEED,
    )
    ci = result.confidence_interval
    return Effect(mean, float(ci.low), float(ci.high), n, interval, confidence)


def _mean(x: Any, axis: int = -1) -> Any:
    return x.mean(axis=axis)


def _signed(effect: Effect, better: str) -> tuple[float, float]:
    """The interval with "B is better" positive."""
    if better not in DIRECTIONS:
        raise ValueError(f"better={better!r} is not one of: {', '.join(DIRECTIONS)}")
    return (effect.low, effect.high) if better == "higher" else (-effect.high, -effect.low)


def within(effect: Effect, margin: Margin) -> bool:
    """Whether the whole interval lies inside [-margin, +margin]."""
    return -margin.value <= effect.low and effect.high <= margin.value


def beats(effect: Effect, better: str, margin: Margin) -> str:
    """The rule for "B beats A": holds, fails or inconclusive (module docstring)."""
    low, high = _signed(effect, better)
    if low > 0:
        return "holds"
    if high < 0 or within(effect, margin):
        return "fails"
    return "inconclusive"


def matches(effect: Effect, margin: Margin) -> str:
    """The rule for "B performs like A": holds, fails or inconclusive (module docstring)."""
    if within(effect, margin):
        return "holds"
    if effect.low > margin.value or effect.high < -margin.value:
        return "fails"
    return "inconclusive"


def at_least(effect: Effect, better: str, margin: Margin) -> str:
    """The rule for "B matches or beats A": holds, fails or inconclusive (module docstring)."""
    low, high = _signed(effect, better)
    if low >= -margin.value:
        return "holds"
    return "fails" if high < -margin.value else "inconclusive"


def needs(with_condition: Effect, without_condition: Effect, better: str, margin: Margin) -> str:
    """The rule for "B needs X": B beats A under X and matches A without it (module docstring)."""
    under, absent = beats(with_condition, better, margin), matches(without_condition, margin)
    if under == "fails" or beats(without_condition, better, margin) == "holds":
        return "fails"
    if under == "holds" and absent == "holds":
        return "holds"
    return "inconclusive"


RULES: dict[str, Callable[..., str]] = {
    "beats": beats,
    "matches": matches,
    "at least": at_least,
    "needs": needs,
}


def noise_margin(a: Sequence[float], a_again: Sequence[float], what: str, interval: str = "t") -> Margin:
    """The seed-noise margin: identical settings run twice with different seeds (``a`` and ``a_again``,
    paired by position), the largest difference their interval admits. ``what`` says which runs."""
    null = paired_effect(a, a_again, interval)
    value = max(abs(null.low), abs(null.high))
    if value == 0:
        raise ValueError(f"the null arm ({what}) shows no seed noise at all: a margin needs a stated source")
    return Margin(value, "seed noise", f"{what}: identical settings, other seeds, {null}")


@dataclass(frozen=True)
class Sensitivity:
    """A verdict recomputed under neighbouring choices: ``robust`` when every neighbour agrees."""

    verdict: str
    neighbours: dict[str, str]  # what changed -> the verdict then

    @property
    def label(self) -> str:
        """``robust`` or ``fragile``."""
        return "robust" if all(v == self.verdict for v in self.neighbours.values()) else "fragile"

    @property
    def flips(self) -> list[str]:
        """The neighbours whose verdict differs."""
        return [name for name, v in self.neighbours.items() if v != self.verdict]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with the label and the flips."""
        return {
            "verdict": self.verdict,
            "label": self.label,
            "neighbours": dict(self.neighbours),
            "flips": self.flips,
        }


def sensitivity(
    decide: Callable[..., str], choices: Mapping[str, Any], neighbours: Mapping[str, Mapping[str, Any]]
) -> Sensitivity:
    """``decide(**choices)`` and ``decide(**{**choices, **change})`` for each named change (a margin x0.5
    and x2, another budget's numbers, one evaluation more or less)."""
    if not neighbours:
        raise ValueError("a sensitivity needs at least one neighbouring choice")
    verdict = decide(**choices)
    again = {name: decide(**{**choices, **change}) for name, change in neighbours.items()}
    return Sensitivity(verdict, again)


def margin_neighbours(margin: Margin, key: str = "margin") -> dict[str, dict[str, Margin]]:
    """The margin halved and doubled, as ``sensitivity``'s neighbours."""
    return {"margin x0.5": {key: margin.scaled(0.5)}, "margin x2": {key: margin.scaled(2.0)}}
