"""relu-sparsity's rule either side of 40% and 60% at init, on most seeds; after training is an
observation, never part of the verdict."""

import pytest

from blocklab.lab.claims import relu_sparsity as claim


def numbers(init=((0.5, 0.5),) * 3, trained=((0.9, 0.9),) * 3):
    return {"init": [list(x) for x in init], "trained": [list(x) for x in trained],
            "dead_trained": [[0.0, 0.0]] * 3, "accuracy": [0.99] * 3}  # fmt: skip


@pytest.mark.parametrize("inside, outside", [(0.4, 0.399), (0.6, 0.601)])
def test_about_half_in_every_layer_on_most_seeds(threshold, inside, outside):
    a = numbers(init=((0.5, inside), (0.5, inside), (0.5, 0.1)))
    b = numbers(init=((0.5, inside), (0.5, outside), (0.5, 0.1)))
    threshold(claim.verdict, a, b, 0)


def test_sparsity_after_training_is_only_observed():
    v = claim.verdict(numbers(trained=((0.99, 0.99),) * 3))
    assert v.verdict == "holds" and len(v.checks) == 1 and "99% 99%" in v.observations[0]
