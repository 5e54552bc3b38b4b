"""pre-vs-post-gradient's checks, and the growth statistic."""

import math

import pytest

from blocklab.lab.claims import pre_vs_post_gradient as claim


def numbers(post=(2.0, 3.0), pre=(1.0, 1.1)):
    return {"depths": [6, 12], "post": list(post), "pre": list(pre)}


def test_growth_is_the_geometric_mean_of_the_last_third_over_the_first():
    profile = [1.0, 2.0, 4.0, 4.0, 8.0, 16.0]  # thirds: (1, 2), (4, 4), (8, 16)
    assert claim.growth(profile) == pytest.approx(math.sqrt(8 * 16) / math.sqrt(1 * 2))
    assert claim.growth([3.0, 3.0, 3.0]) == pytest.approx(1.0)


def test_verdicts():
    assert claim.verdict(numbers()).verdict == "holds"
    assert claim.verdict(numbers(post=(1.0, 1.0), pre=(0.3, 1.0))).verdict == "fails"


def test_post_norm_grows(threshold):
    threshold(claim.verdict, numbers(post=(1.5, 3.0)), numbers(post=(1.49, 3.0)), 0)


@pytest.mark.parametrize("inside, outside", [(1.5, 1.51), (1 / 1.5, 0.666)])
def test_pre_norm_flat(threshold, inside, outside):
    threshold(claim.verdict, numbers(pre=(1.0, inside)), numbers(pre=(1.0, outside)), 1)
