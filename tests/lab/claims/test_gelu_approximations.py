"""gelu-approximations' check, and the errors docs/concepts.md#feed-forward-network states."""

import pytest

from blocklab.lab.claims import gelu_approximations as claim


def numbers(tanh=4.7e-4, sigmoid=9e-4):
    return {"tanh": {"max_err": tanh, "at": 2.7}, "sigmoid": {"max_err": sigmoid, "at": -2.27}}


@pytest.mark.parametrize("index, form", [(0, "tanh"), (1, "sigmoid")])
def test_close_below_one_thousandth(threshold, index, form):
    threshold(claim.verdict, numbers(**{form: 0.99e-3}), numbers(**{form: 1e-3}), index)


def test_measured_errors_are_spec_sections():
    m = claim.measure({"points": 200_001}, claim.CLAIM.setups[0], {})
    assert m["tanh"]["max_err"] == pytest.approx(4.73e-4, abs=1e-6) and abs(m["tanh"]["at"]) == pytest.approx(
        2.70, abs=0.01
    )
    assert m["sigmoid"]["max_err"] == pytest.approx(2.03e-2, abs=1e-4)
