"""pre-vs-post-gradient's rules over seeds, the growth statistic, and the every-token batch."""

import math

import pytest
import torch

from blocklab.lab.claims import pre_vs_post_gradient as claim
from blocklab.lab.claims.shared import every_token_batch, listops_batch


def numbers(post=((2.0, 3.0),) * 3, pre=((1.0, 1.1),) * 3):
    return {"depths": [6, 12], "post": [list(x) for x in post], "pre": [list(x) for x in pre]}


def test_growth_is_the_geometric_mean_of_the_last_third_over_the_first():
    profile = [1.0, 2.0, 4.0, 4.0, 8.0, 16.0]  # thirds: (1, 2), (4, 4), (8, 16)
    assert claim.growth(profile) == pytest.approx(math.sqrt(8 * 16) / math.sqrt(1 * 2))
    assert claim.growth([3.0, 3.0, 3.0]) == pytest.approx(1.0)


def test_verdicts():
    assert claim.verdict(numbers()).verdict == "holds"
    assert claim.verdict(numbers(post=((1.0, 1.0),) * 3, pre=((0.3, 1.0),) * 3)).verdict == "fails"


def test_post_norm_grows_at_every_depth_on_most_seeds(threshold):
    inside = numbers(post=((1.5, 3.0), (1.5, 3.0), (1.0, 1.0)))
    outside = numbers(post=((1.5, 3.0), (1.49, 3.0), (1.0, 1.0)))
    threshold(claim.verdict, inside, outside, 0)


@pytest.mark.parametrize("inside, outside", [(1.5, 1.51), (1 / 1.5, 0.666)])
def test_pre_norm_flat_on_most_seeds(threshold, inside, outside):
    a = numbers(pre=((1.0, inside), (1.0, inside), (1.0, 9.0)))
    b = numbers(pre=((1.0, inside), (1.0, outside), (1.0, 9.0)))
    threshold(claim.verdict, a, b, 1)


def test_every_token_is_scored_with_the_next_token_and_the_last_with_the_answer():
    inputs, targets = every_token_batch(4)
    listops_inputs, listops_targets = listops_batch(4)
    assert torch.equal(inputs, listops_inputs)
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    assert torch.equal(targets[:, -1], listops_targets[:, -1]) and (targets >= 0).all()
