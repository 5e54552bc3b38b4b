"""layernorm-moments' checks either side of their tolerances, and the measurement against
docs/concepts.md#layer-normalization."""

import pytest

from blocklab.lab.claims import layernorm_moments as claim


def numbers(out_var=0.909, predicted=0.909, mean=0.0):
    row = {"input_var": 1e-4, "out_mean": mean, "out_var": out_var, "predicted_var": predicted}
    return {"eps": 1e-5, "rows": [row]}


def test_mean_zero(threshold):
    threshold(claim.verdict, numbers(mean=0.9e-6), numbers(mean=1.1e-6), 0)


def test_variance_is_var_over_var_plus_eps(threshold):
    threshold(claim.verdict, numbers(0.909, 0.909 + 0.9e-6), numbers(0.909, 0.909 + 1.1e-6), 1)


def test_the_shortfall_below_one_is_reported_not_scored():
    v = claim.verdict(numbers(0.909, 0.909))
    assert v.verdict == "holds" and "9.1e-02 at var 0.0001" in v.observations[0]


def test_measured_variance_is_spec_sections_worked_example():
    sizes = {"d_model": 64, "n": 64, "input_vars": [1.0, 0.01186, 1e-5]}
    m = claim.measure(sizes, claim.CLAIM.setups[0], {})
    by_var = {r["input_var"]: r for r in m["rows"]}
    # docs/concepts.md#layer-normalization's example
    assert by_var[0.01186]["out_var"] == pytest.approx(0.99916, abs=1e-5)
    assert by_var[1e-5]["out_var"] == pytest.approx(0.5, abs=1e-9)  # var = eps halves it
    assert claim.verdict(m).verdict == "holds"  # the formula holds at every scale, eps included
