"""post-norm-gradient and pre-norm-gradient: the growth statistic (log10 of the last third of the layers
over the first), "beats 0" for post-norm and "matches 0" for pre-norm at every depth; the every-token
batch."""

import math

import pytest
import torch

from blocklab.lab.claims import post_norm_gradient, pre_norm_gradient
from blocklab.lab.claims.post_norm_gradient import growth
from blocklab.lab.claims.shared import every_token_batch, listops_batch


def numbers(spread, position, centres):
    return {
        "position": position,
        "depths": [6, 12],
        "growth": [spread(c) for c in centres],
        "null_deepest": list(reversed(spread(centres[-1], width=0.012))),
        "profile": [1.0, 2.0],
    }


def test_growth_is_log10_of_the_geometric_mean_of_the_last_third_over_the_first():
    profile = [1.0, 2.0, 4.0, 4.0, 8.0, 16.0]  # thirds: (1, 2), (4, 4), (8, 16)
    assert growth(profile) == pytest.approx(math.log10(math.sqrt(8 * 16) / math.sqrt(1 * 2)))
    assert growth([3.0, 3.0, 3.0]) == pytest.approx(0.0)


def test_post_norm_grows_at_every_depth(spread):
    assert post_norm_gradient.verdict(numbers(spread, "post", [0.2, 0.3])).verdict == "holds"
    v = post_norm_gradient.verdict(numbers(spread, "post", [0.2, -0.1]))
    assert v.verdict == "fails" and [t["outcome"] for t in v.checks] == ["holds", "fails"]


def test_pre_norm_flat_at_every_depth(spread):
    assert pre_norm_gradient.verdict(numbers(spread, "pre", [0.0, 0.0])).verdict == "holds"
    assert pre_norm_gradient.verdict(numbers(spread, "pre", [0.0, -0.3])).verdict == "fails"


def test_every_token_is_scored_with_the_next_token_and_the_last_with_the_answer():
    inputs, targets = every_token_batch(4)
    listops_inputs, listops_targets = listops_batch(4)
    assert torch.equal(inputs, listops_inputs)
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    assert torch.equal(targets[:, -1], listops_targets[:, -1]) and (targets >= 0).all()
