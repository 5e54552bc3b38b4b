"""gelu-approximations' checks, and the errors docs/concepts.md#feed-forward-network states."""

import pytest

from blocklab.lab.claims import gelu_approximations as claim


def numbers(tanh=1.8e-4, sigmoid=9e-3, tanh_err=4.7e-4, sigmoid_err=2e-2):
    return {"tanh": {"max_err": tanh_err, "at": 2.7, "relative": tanh},
            "sigmoid": {"max_err": sigmoid_err, "at": 2.27, "relative": sigmoid}}  # fmt: skip


def test_tanh_close_within_bfloat16s_rounding_step(threshold):
    threshold(claim.verdict, numbers(tanh=2**-8), numbers(tanh=1.01 * 2**-8), 0)


def test_sigmoid_less_exact_than_tanh(threshold):
    threshold(claim.verdict, numbers(sigmoid_err=4.8e-4), numbers(sigmoid_err=4.7e-4), 1)


def test_measured_errors_are_spec_sections():
    m = claim.measure({"points": 200_001}, claim.CLAIM.setups[0], {})
    assert m["tanh"]["max_err"] == pytest.approx(4.73e-4, abs=1e-6)
    assert m["tanh"]["at"] == pytest.approx(2.70, abs=0.01)
    assert m["sigmoid"]["max_err"] == pytest.approx(2.03e-2, abs=1e-4)
    assert m["sigmoid"]["at"] == pytest.approx(2.27, abs=0.01)
    # relative to GELU at |x|: x * Phi(x) from math.erf, an independent oracle
    import math

    gelu = lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2)))
    for form in ("tanh", "sigmoid"):
        assert m[form]["relative"] == pytest.approx(m[form]["max_err"] / gelu(m[form]["at"]), rel=1e-9)
    assert claim.verdict(m).verdict == "holds"
