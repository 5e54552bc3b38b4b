"""residual-gradient and plain-gradient: log10 first/top at the deepest depth against the shallowest, paired
by seed: "matches" with residuals, "differs" without; a gradient that overflowed or underflowed float32 is
read at float32's ends; the measurement on a tiny stack."""

import math

import pytest

from blocklab.lab.claims import plain_gradient, residual_gradient
from blocklab.lab.claims.residual_gradient import FAMILIES, LOG10_OVERFLOW, LOG10_UNDERFLOW, log_ratio


def numbers(spread, shallow, deep, residual):
    arm = {
        "log10_ratio": [spread(shallow), spread(deep)],
        "null_deepest": list(reversed(spread(deep, width=0.012))),
    }
    return {"depths": [2, 20], "families": {f: {residual: arm} for f in FAMILIES}}


def test_with_residuals_a_share_that_stays_holds_and_one_that_falls_fails(spread):
    assert residual_gradient.verdict(numbers(spread, -0.3, -0.3, "add")).verdict == "holds"
    assert residual_gradient.verdict(numbers(spread, -0.3, -3.0, "add")).verdict == "fails"


def test_without_residuals_vanishing_and_exploding_both_hold_and_staying_fails(spread):
    assert plain_gradient.verdict(numbers(spread, -0.3, -8.0, "none")).verdict == "holds"
    assert plain_gradient.verdict(numbers(spread, -0.3, 5.0, "none")).verdict == "holds"
    v = plain_gradient.verdict(numbers(spread, -0.3, -0.3, "none"))
    assert v.verdict == "fails" and v.checks[0]["rule"] == "differs"


def test_a_gradient_that_left_float32_is_read_at_its_ends():
    assert log_ratio(1.0, 100.0) == pytest.approx(-2.0)
    assert log_ratio(math.inf, 1.0) == LOG10_OVERFLOW and log_ratio(math.nan, 1.0) == LOG10_OVERFLOW
    assert log_ratio(0.0, 1.0) == LOG10_UNDERFLOW and log_ratio(1e-300, 1e300) == LOG10_UNDERFLOW


def test_the_measurement_reads_the_diagnostics_first_and_top_gradients():
    sizes = {"d_model": 16, "batch": 4, "depths": [1, 2], "seeds": 2}
    m = residual_gradient.measure(sizes, residual_gradient.HE, {})
    arm = m["families"]["pre-norm"]["add"]
    assert len(arm["log10_ratio"]) == 2 and len(arm["log10_ratio"][0]) == 2 and len(arm["null_deepest"]) == 2
    assert all(math.isfinite(x) for row in arm["log10_ratio"] for x in row)
    assert residual_gradient.verdict(m).checks[0]["effect"]["n"] == 2
