"""layernorm-vs-batchnorm's six checks either side of their thresholds."""

import copy

import pytest

from blocklab.lab.claims import layernorm_vs_batchnorm as claim


def numbers():
    return {
        "invariance": {
            "standard": {"batch_change": 0.0, "mode_change": 0.0},
            "batch": {"batch_change": 0.1, "mode_change": 0.1},
        },
        "accuracy": {
            "standard": {"1": 0.9, "8": 0.9, "64": 0.95, "padded": 0.9},
            "batch": {"1": 0.3, "8": 0.9, "64": 0.95, "padded": 0.3},
        },
    }


def test_textbook_numbers_hold():
    assert claim.verdict(numbers()).verdict == "holds"


@pytest.mark.parametrize(
    "index, path, inside, outside",
    [
        (0, ("invariance", "standard", "batch_change"), 0.99e-5, 1e-5),
        (1, ("invariance", "standard", "mode_change"), 0.99e-5, 1e-5),
        (2, ("invariance", "batch", "batch_change"), 1.01e-3, 1e-3),
        (3, ("invariance", "batch", "mode_change"), 1.01e-3, 1e-3),
        (4, ("accuracy", "batch", "1"), 0.8499, 0.8501),
        (5, ("accuracy", "batch", "padded"), 0.8499, 0.8501),
    ],
)
def test_each_check(threshold, index, path, inside, outside):
    a, b = copy.deepcopy(numbers()), copy.deepcopy(numbers())
    *parents, leaf = path
    for m, value in ((a, inside), (b, outside)):
        node = m
        for key in parents:
            node = node[key]
        node[leaf] = value
    threshold(claim.verdict, a, b, index)
