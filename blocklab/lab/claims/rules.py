"""Tests from a setup's numbers: each claim states its arms, the direction that is better, and its margin;
the rule is ``lab.statistics``' for the word, the same in every claim.

    compare      "B beats A" / "B performs like A" / "B matches or beats A" / "B differs from A" (the
                 negation of "performs like": the whole interval outside the margin holds, inside it
                 fails): the paired effect of per-seed numbers
    exceeds      "the number is above (below) a bound": a paired effect against the bound, seed by seed
    dose         "B needs X": the effect under X and without it (``statistics.needs``)
    exact        arithmetic: the numbers equal the stated ones within a float tolerance

Each test carries its neighbours (the sensitivity): the margin halved and doubled always, and the
other readings of the same runs a claim passes (``alt``: the runs read one evaluation earlier, at half
their budget), each decided by the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .. import statistics
from ..statistics import Margin, paired_effect
from .base import Test

Pair = tuple[Sequence[float], Sequence[float]]  # (A's per-seed numbers, B's), paired by seed


def source_margin(value: float, words: str) -> Margin:
    """A margin the source states (``words``: its words)."""
    return Margin(value, "source", words)


COMPARE_WORDS = ("beats", "matches", "at least", "differs")
NEGATED = {"holds": "fails", "fails": "holds", "inconclusive": "inconclusive"}


def _decide(word: str, pair: Pair, better: str, margin: Margin) -> str:
    effect = paired_effect(*pair)
    if word == "beats":
        return statistics.beats(effect, better, margin)
    if word == "at least":
        return statistics.at_least(effect, better, margin)
    same = statistics.matches(effect, margin)
    return same if word == "matches" else NEGATED[same]


def _margins(margin: Margin) -> dict[str, Margin]:
    return {"margin x0.5": margin.scaled(0.5), "margin x2": margin.scaled(2.0)}


def compare(
    check: str, word: str, pair: Pair, better: str, margin: Margin, alt: Mapping[str, Pair] | None = None
) -> Test:
    """``word`` ("beats": B beats A; "matches": B performs like A; "at least": B matches or beats A;
    "differs": B does not perform like A) on the paired effect B - A."""
    if word not in COMPARE_WORDS:
        raise ValueError(f"compare's word={word!r} is not one of: {', '.join(COMPARE_WORDS)}")
    outcome = _decide(word, pair, better, margin)
    neighbours = {name: _decide(word, pair, better, m) for name, m in _margins(margin).items()}
    neighbours |= {name: _decide(word, other, better, margin) for name, other in (alt or {}).items()}
    return Test(check, word, outcome, paired_effect(*pair).to_dict(), margin.to_dict(), neighbours)


def exceeds(
    check: str,
    values: Sequence[float],
    bound: float,
    better: str,
    margin: Margin,
    alt: Mapping[str, Sequence[float]] | None = None,
) -> Test:
    """The per-seed ``values`` beat the fixed ``bound`` in the ``better`` direction ("higher": above it)."""
    as_pair = lambda xs: ([bound] * len(xs), xs)
    return compare(
        check,
        "beats",
        as_pair(values),
        better,
        margin,
        {name: as_pair(xs) for name, xs in (alt or {}).items()},
    )


def _dose(under: Pair, without: Pair, better: str, margin: Margin) -> str:
    return statistics.needs(paired_effect(*under), paired_effect(*without), better, margin)


def dose(
    check: str,
    under: Pair,
    without: Pair,
    better: str,
    margin: Margin,
    alt: Mapping[str, tuple[Pair, Pair]] | None = None,
) -> Test:
    """ "B needs X": B beats A under the condition (``under``) and performs like A without it."""
    outcome = _dose(under, without, better, margin)
    neighbours = {name: _dose(under, without, better, m) for name, m in _margins(margin).items()}
    neighbours |= {name: _dose(*pairs, better, margin) for name, pairs in (alt or {}).items()}
    effect = {"under": paired_effect(*under).to_dict(), "without": paired_effect(*without).to_dict()}
    return Test(check, "needs", outcome, effect, margin.to_dict(), neighbours)


def exact(
    check: str, got: Sequence[float], expected: Sequence[float], rtol: float = 1e-6, absolute: bool = False
) -> Test:
    """Arithmetic: each number equals the stated one within ``rtol`` of it (``absolute``, or where the stated
    number is 0: within ``rtol`` itself); the neighbours take the tolerance halved and doubled, as a
    margin's."""
    if len(got) != len(expected) or not got:
        raise ValueError(f"exact compares one number to one: got {len(got)} against {len(expected)}")

    def decide(tol: float) -> str:
        scale = lambda e: 1.0 if absolute or e == 0 else abs(e)
        close = all(abs(g - e) <= tol * scale(e) for g, e in zip(got, expected, strict=True))
        return "holds" if close else "fails"

    numbers = {"got": [float(g) for g in got], "expected": [float(e) for e in expected], "rtol": rtol}
    return Test(
        check,
        "exact",
        decide(rtol),
        numbers,
        None,
        {"tolerance x0.5": decide(rtol / 2), "tolerance x2": decide(rtol * 2)},
    )


def noise(
    a: Sequence[float], a_again: Sequence[float], what: str, floor: float = 0.0, floor_words: str = ""
) -> Margin:
    """The seed-noise margin: the largest difference the paired interval of identical runs with other
    seeds admits (``statistics.noise_margin``), and never below ``floor``, the resolution of the number
    (``floor_words`` say what it is: one evaluation for steps to a target)."""
    null = paired_effect(a, a_again)
    value = max(abs(null.low), abs(null.high))
    text = f"{what}: identical settings, other seeds, {null}"
    if value < floor:
        value, text = floor, f"{text}; below the resolution, so {floor_words} ({floor:g})"
    return Margin(value, "seed noise", text)


def exact_below(check: str, smaller: float, larger: float) -> Test:
    """Arithmetic: ``smaller`` < ``larger`` (an ordering computed exactly has no neighbours)."""
    numbers = {"got": [float(smaller)], "expected": [float(larger)], "rtol": 0.0}
    return Test(check, "exact", "holds" if smaller < larger else "fails", numbers, None, {})
