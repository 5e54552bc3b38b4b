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


@pytest.mark.parametrize("inside, outside", [(0.1, 0.0999), (1e6, 0.0999)])
def test_alive_means_not_vanished(threshold, inside, outside):
    """A gradient that grows is alive: the source speaks of vanishing only."""
    threshold(claim.verdict, numbers(add=(1.0, inside)), numbers(add=(1.0, outside)), 0)


def test_an_overflowed_depth_is_left_out_of_the_alive_check_and_said():
    v = claim.verdict(numbers(add=(1.0, None)))
    assert v.checks[0]["ok"] and "n/f" in v.observations[0] and "left out" in v.observations[0]
    assert not claim.verdict(numbers(add=(0.01, None))).checks[0]["ok"]
    assert not claim.verdict(numbers(add=(None, None))).checks[0]["ok"]  # nothing finite shows it alive


def test_a_growing_gradient_is_observed_not_scored():
    assert claim.verdict(numbers(add=(1.0, 10.0))).observations == []
    v = claim.verdict(numbers(add=(1.0, 10.01)))
    assert v.verdict == "holds" and "more than 10x" in v.observations[0] and "1 10" in v.observations[0]


def test_not_finite_ratios_without_residuals_count_as_nothing():
    assert not any(c["ok"] for c in claim.verdict(numbers(none=(None, None))).checks[1:])


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


def test_a_ratio_that_was_not_finite_plots_as_a_gap():
    """The report stores NaN and inf as None; the claims page must still draw (it failed on the full run)."""
    from matplotlib.figure import Figure

    m = numbers(add=(1.0, None))
    m["profiles"] = {f: {"add": [1.0, None], "none": [1.0, 0.5]} for f in FAMILIES}
    fig = Figure()
    claim.plot(m, fig)
    line = fig.axes[0].lines[0]
    assert list(line.get_ydata()[:1]) == [1.0] and str(line.get_ydata()[1]) == "nan"
