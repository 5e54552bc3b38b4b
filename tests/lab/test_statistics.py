"""blocklab/lab/statistics.py: the paired interval against a textbook example, each word's rule on both
sides of its margin, the seed-noise margin worked by hand, and sensitivity labels on a case built to flip."""

from __future__ import annotations

import math
import random

import pytest

from blocklab.lab.statistics import (
    Effect,
    Margin,
    at_least,
    beats,
    margin_neighbours,
    matches,
    needs,
    noise_margin,
    paired_effect,
    sensitivity,
)

# Student's sleep data (Cushny and Peebles, as R ships it): extra hours of sleep of ten patients under two
# drugs. R: t.test(sleep$extra[11:20], sleep$extra[1:10], paired = TRUE) gives mean of the differences
# 1.58 and the 95 percent confidence interval 0.7001142 2.4598858.
DRUG_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
MARGIN = Margin(0.5, "source", "'about the same' read as within 0.5")


def effect(low: float, high: float, n: int = 5) -> Effect:
    return Effect((low + high) / 2, low, high, n, "t")


def test_the_paired_t_interval_is_the_textbooks() -> None:
    found = paired_effect(DRUG_1, DRUG_2)
    assert found.n == 10 and found.interval == "t"
    assert found.mean == pytest.approx(1.58, abs=1e-12)
    assert found.low == pytest.approx(0.7001142, abs=1e-7)
    assert found.high == pytest.approx(2.4598858, abs=1e-7)
    swapped = paired_effect(DRUG_2, DRUG_1)  # B - A the other way round
    assert (swapped.low, swapped.high) == pytest.approx((-2.4598858, -0.7001142), abs=1e-7)


def test_the_bootstrap_interval_brackets_the_mean_and_agrees_with_t_on_normal_differences() -> None:
    rng = random.Random(1)
    a = [rng.gauss(0, 1) for _ in range(200)]
    b = [x + 0.3 + rng.gauss(0, 0.5) for x in a]
    t, boot = paired_effect(a, b), paired_effect(a, b, "bootstrap")
    assert boot.low < boot.mean < boot.high and boot.mean == t.mean
    assert boot.low == pytest.approx(t.low, abs=0.02) and boot.high == pytest.approx(t.high, abs=0.02)
    shifted = paired_effect([1.0, 2.0, 3.0], [2.0, 3.0, 4.0], "bootstrap")  # no spread: the point itself
    assert shifted == Effect(1.0, 1.0, 1.0, 3, "bootstrap")


def test_unpaired_short_or_non_finite_arms_are_refused_by_name() -> None:
    for a, b, message in [
        ([1.0, 2.0], [1.0], "one number per seed"),
        ([1.0], [2.0], "at least 2 seeds"),
        ([1.0, math.nan], [1.0, 2.0], "not finite"),
    ]:
        with pytest.raises(ValueError, match=message):
            paired_effect(a, b)
    with pytest.raises(ValueError, match="interval='z'"):
        paired_effect([1.0, 2.0], [2.0, 3.0], "z")


@pytest.mark.parametrize(
    ("low", "high", "better", "verdict"),
    [
        (0.1, 0.9, "higher", "holds"),  # excludes 0 on B's side
        (-0.9, -0.1, "lower", "holds"),  # a loss: lower is better
        (-0.9, -0.1, "higher", "fails"),  # excludes 0 on A's side
        (-0.4, 0.4, "higher", "fails"),  # inside the margin: no difference worth the word
        (-0.2, 0.8, "higher", "inconclusive"),  # straddles 0 and leaves the margin
    ],
)
def test_beats_on_both_sides_of_zero_and_of_the_margin(low, high, better, verdict) -> None:
    assert beats(effect(low, high), better, MARGIN) == verdict


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (-0.49, 0.49, "holds"),
        (-0.5, 0.5, "holds"),
        (-0.51, 0.2, "inconclusive"),
        (0.2, 0.7, "inconclusive"),
        (0.51, 0.9, "fails"),
        (-0.9, -0.51, "fails"),
    ],
)
def test_matches_on_both_sides_of_the_margin(low, high, verdict) -> None:
    assert matches(effect(low, high), MARGIN) == verdict


@pytest.mark.parametrize(
    ("low", "high", "better", "verdict"),
    [
        (-0.49, 0.9, "higher", "holds"),  # no worse than the margin
        (-0.5, -0.4, "higher", "holds"),  # worse, but inside the margin
        (0.4, 0.5, "lower", "holds"),  # the same for a loss
        (-0.9, -0.51, "higher", "fails"),  # worse beyond the margin
        (-0.7, 0.1, "higher", "inconclusive"),  # might be worse beyond it
    ],
)
def test_at_least_is_non_inferiority(low, high, better, verdict) -> None:
    assert at_least(effect(low, high), better, MARGIN) == verdict


@pytest.mark.parametrize(
    ("under", "without", "verdict"),
    [
        ((0.6, 1.2), (-0.3, 0.3), "holds"),  # present under X, absent without
        ((0.6, 1.2), (0.6, 1.2), "fails"),  # present without X too
        ((-0.2, 0.2), (-0.3, 0.3), "fails"),  # absent under X
        ((0.6, 1.2), (-0.2, 0.9), "inconclusive"),  # without X: cannot tell
    ],
)
def test_needs_is_a_dose_response(under, without, verdict) -> None:
    assert needs(effect(*under), effect(*without), "higher", MARGIN) == verdict


def test_the_seed_noise_margin_is_the_null_arms_widest_admitted_difference() -> None:
    a, again = [10.0, 12.0, 11.0, 13.0, 12.0], [11.0, 11.0, 12.0, 12.0, 14.0]
    d = [1.0, -1.0, 1.0, -1.0, 2.0]  # mean 0.4, sd sqrt(1.8), t(0.975, 4) = 2.7764451
    half = 2.7764451 * math.sqrt(1.8) / math.sqrt(5)
    margin = noise_margin(a, again, "the default setup, seeds 0-4 against 5-9")
    assert [y - x for x, y in zip(a, again, strict=True)] == d
    assert margin.value == pytest.approx(0.4 + half, abs=1e-6) and margin.origin == "seed noise"
    assert "seeds 0-4 against 5-9" in margin.text
    with pytest.raises(ValueError, match="no seed noise"):
        noise_margin([1.0, 2.0], [1.0, 2.0], "twice the same")


def test_margins_say_where_they_come_from() -> None:
    for value, origin, text, message in [
        (0.0, "source", "x", "above 0"),
        (math.inf, "source", "x", "finite"),
        (0.1, "hunch", "x", "origin='hunch'"),
        (0.1, "source", " ", "empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            Margin(value, origin, text)


def test_sensitivity_labels_a_verdict_that_flips_with_the_margin_fragile() -> None:
    interval = effect(0.5, 0.9)  # inside a margin of 1.2, outside one of 0.3, straddling one of 0.6
    margin = Margin(0.6, "seed noise", "null arm")
    fragile = sensitivity(matches, {"effect": interval, "margin": margin}, margin_neighbours(margin))
    assert fragile.verdict == "inconclusive" and fragile.label == "fragile"
    assert fragile.neighbours == {"margin x0.5": "fails", "margin x2": "holds"}
    assert fragile.flips == ["margin x0.5", "margin x2"]
    steady = sensitivity(
        beats,
        {"effect": effect(1.5, 2.5), "better": "higher", "margin": margin},
        {**margin_neighbours(margin), "another budget": {"effect": effect(1.0, 3.0)}},
    )
    assert steady.verdict == "holds" and steady.label == "robust" and steady.flips == []
    assert steady.to_dict()["label"] == "robust"
