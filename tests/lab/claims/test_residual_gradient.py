"""residual-gradient's checks, each from synthetic numbers either side of its threshold."""

import copy

import pytest

from blocklab.lab.claims import residual_gradient as claim

FAMILIES = list(claim.FAMILIES)


def numbers(add=(1.0, 1.0), none=(0.5, 1e-4)):
    return {"depths": [2, 20], "families": {f: {"add": list(add), "none": list(none)} for f in FAMILIES}}


def test_all_checks_hold_on_textbook_numbers():
    assert claim.verdict(numbers()).verdict == "holds"
    assert claim.verdict(numbers(add=(1e-3, 1e-3), none=(0.5, 0.4))).verdict == "fails"


@pytest.mark.parametrize("inside, outside", [(0.1, 0.0999), (10.0, 10.01)])
def test_alive_bounds(threshold, inside, outside):
    threshold(claim.verdict, numbers(add=(1.0, inside)), numbers(add=(1.0, outside)), 0)


@pytest.mark.parametrize("family", range(len(FAMILIES)))
def test_vanished_below_one_hundredth_at_the_deepest_depth(threshold, family):
    inside, outside = numbers(none=(0.5, 0.00999)), numbers(none=(0.5, 0.00999))
    outside["families"][FAMILIES[family]]["none"] = [0.5, 0.01]
    threshold(claim.verdict, inside, outside, 1 + 2 * family)


@pytest.mark.parametrize("family", range(len(FAMILIES)))
def test_keeps_shrinking_tenfold(threshold, family):
    inside = numbers(none=(0.05, 0.00499))
    outside = copy.deepcopy(inside)
    outside["families"][FAMILIES[family]]["none"] = [0.0499, 0.00499]
    threshold(claim.verdict, inside, outside, 2 + 2 * family)
