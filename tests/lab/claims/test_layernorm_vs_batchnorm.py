"""layernorm-vs-batchnorm's five checks either side of their thresholds, the batch-1 rule over seeds,
inconclusive when LayerNorm at the largest batch does not train, and padding only observed."""

import copy

import pytest

from blocklab.lab.claims import layernorm_vs_batchnorm as claim

HIT = 0.995


@pytest.fixture
def numbers(arm):
    def make(ln1=(0.9, 0.9, 0.9), bn1=(0.3, 0.3, 0.3), ln64=(HIT,) * 3):
        return {
            "invariance": {
                "standard": {"batch_change": 0.0, "mode_change": 0.0},
                "batch": {"batch_change": 0.1, "mode_change": 0.1},
            },
            "arms": {
                "standard": {"1": arm(list(ln1)), "64": arm(list(ln64)), "padded": arm([HIT] * 3)},
                "batch": {"1": arm(list(bn1)), "64": arm([HIT] * 3), "padded": arm([0.3] * 3)},
            },
            "settings": ["1", "64", "padded"],
        }

    return make


def test_textbook_numbers_hold(numbers):
    v = claim.verdict(numbers())
    assert v.verdict == "holds" and "pad-masked BatchNorm" in v.observations[0]


@pytest.mark.parametrize(
    "index, path, inside, outside",
    [
        (0, ("invariance", "standard", "batch_change"), 0.99e-5, 1e-5),
        (1, ("invariance", "standard", "mode_change"), 0.99e-5, 1e-5),
        (2, ("invariance", "batch", "batch_change"), 1.01e-3, 1e-3),
        (3, ("invariance", "batch", "mode_change"), 1.01e-3, 1e-3),
    ],
)
def test_each_invariance_check(threshold, numbers, index, path, inside, outside):
    a, b = copy.deepcopy(numbers()), copy.deepcopy(numbers())
    *parents, leaf = path
    for m, value in ((a, inside), (b, outside)):
        node = m
        for key in parents:
            node = node[key]
        node[leaf] = value
    threshold(claim.verdict, a, b, index)


def test_batchnorm_worse_at_batch_size_1_on_most_seeds(threshold, numbers):
    threshold(claim.verdict, numbers(bn1=(0.8499, 0.8499, 0.9)), numbers(bn1=(0.8499, 0.8501, 0.9)), 4)


def test_inconclusive_when_layernorm_does_not_train_at_the_largest_batch(numbers):
    assert claim.verdict(numbers(ln64=(HIT, HIT, 0.5))).verdict == "holds"
    assert claim.verdict(numbers(ln64=(HIT, 0.5, 0.5))).verdict == "inconclusive"
