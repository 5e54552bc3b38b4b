"""The tests a claim builds from its numbers (``claims.rules``): each word's rule on synthetic per-seed
numbers either side of its margin, the neighbours of the sensitivity, exact arithmetic, and the seed-noise
margin with its floor."""

import pytest

from blocklab.lab.claims.rules import compare, dose, exact, exact_below, exceeds, noise, source_margin
from blocklab.lab.statistics import paired_effect

MARGIN = source_margin(0.1, "a tenth, as the source says")
A = [1.0, 1.1, 0.9, 1.05, 0.95]


def shifted(by):
    return [a + by for a in A]


@pytest.mark.parametrize(
    ("word", "by", "outcome"),
    [
        ("beats", 0.5, "holds"),
        ("beats", -0.5, "fails"),
        ("beats", 0.0, "fails"),
        ("matches", 0.0, "holds"),
        ("matches", 0.5, "fails"),
        ("at least", -0.05, "holds"),
        ("at least", -0.5, "fails"),
        ("differs", 0.5, "holds"),
        ("differs", 0.0, "fails"),
    ],
)
def test_each_word_on_a_constant_shift(word, by, outcome):
    test = compare("B against A", word, (A, shifted(by)), "higher", MARGIN)
    assert test.outcome == outcome and test.rule == word
    assert test.effect == paired_effect(A, shifted(by)).to_dict() and test.margin["origin"] == "source"


def test_noisy_pairs_are_inconclusive_and_the_margin_neighbours_can_flip_them():
    b = [a + d for a, d in zip(A, (0.3, -0.2, 0.25, -0.1, 0.1), strict=True)]
    test = compare("B against A", "matches", (A, b), "higher", MARGIN)
    effect = paired_effect(A, b)
    assert test.outcome == "inconclusive" and effect.low < -0.1 < 0.1 < effect.high
    wide = compare("B against A", "matches", (A, b), "higher", source_margin(1.0, "wide"))
    assert wide.outcome == "holds" and wide.neighbours["margin x0.5"] == "holds"


def test_other_readings_of_the_same_runs_are_neighbours():
    test = compare(
        "B beats A", "beats", (A, shifted(0.5)), "higher", MARGIN, alt={"half the budget": (A, shifted(0.0))}
    )
    assert test.neighbours == {"margin x0.5": "holds", "margin x2": "holds", "half the budget": "fails"}


def test_exceeds_is_beats_against_a_fixed_bound():
    assert exceeds("above 1", shifted(0.5), 1.0, "higher", MARGIN).outcome == "holds"
    assert (
        exceeds("above 1", A, 1.0, "higher", MARGIN).outcome == "fails"
    )  # the mean is 1, the interval tight
    assert exceeds("below 2", A, 2.0, "lower", MARGIN).outcome == "holds"


def test_dose_needs_the_effect_under_the_condition_and_none_without():
    assert dose("X needs Y", (A, shifted(0.5)), (A, shifted(0.0)), "higher", MARGIN).outcome == "holds"
    assert dose("X needs Y", (A, shifted(0.5)), (A, shifted(0.5)), "higher", MARGIN).outcome == "fails"
    test = dose("X needs Y", (A, shifted(0.0)), (A, shifted(0.0)), "higher", MARGIN)
    assert test.outcome == "fails" and set(test.effect) == {"under", "without"}


def test_exact_is_relative_absolute_at_zero_and_its_neighbours_halve_and_double_the_tolerance():
    assert exact("equal", [1.000001], [1.0], 1e-6).outcome == "holds"
    assert exact("equal", [1.0000011], [1.0], 1e-6).outcome == "fails"
    assert exact("zero", [1e-7], [0.0], 1e-6).outcome == "holds"
    assert exact("share", [0.549], [0.6], 0.05, absolute=True).outcome == "fails"
    test = exact("equal", [1.0000015], [1.0], 1e-6)
    assert test.neighbours == {"tolerance x0.5": "fails", "tolerance x2": "holds"}
    assert (
        exact_below("smaller", 1.0, 2.0).outcome == "holds"
        and exact_below("smaller", 2.0, 2.0).outcome == "fails"
    )
    with pytest.raises(ValueError, match="one number to one"):
        exact("equal", [1.0], [1.0, 2.0])


def test_the_noise_margin_is_the_null_arms_widest_admitted_difference_never_below_the_floor():
    margin = noise(A, list(reversed(A)), "A again")
    assert margin.origin == "seed noise" and margin.value == pytest.approx(
        max(abs(paired_effect(A, list(reversed(A))).low), abs(paired_effect(A, list(reversed(A))).high))
    )
    floored = noise(A, A, "A on the same seeds", floor=25.0, floor_words="one evaluation")
    assert floored.value == 25.0 and "one evaluation" in floored.text
    with pytest.raises(ValueError, match="above 0"):
        noise(A, A, "no spread and no floor")
