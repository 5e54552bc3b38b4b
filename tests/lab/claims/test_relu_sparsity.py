"""relu-sparsity: the fraction of zeros at init (mean over layers, per seed) matches 50% within the source's
precision (5 points); after training is an observation, never part of the verdict."""

from blocklab.lab.claims import relu_sparsity as claim


def numbers(init, trained=((0.9, 0.9),) * 5):
    return {"init": [list(x) for x in init], "trained": [list(x) for x in trained],
            "dead_trained": [[0.0, 0.0]] * 5, "accuracy": [0.99] * 5}  # fmt: skip


def test_about_half_holds_and_a_fraction_outside_the_precision_fails(spread):
    assert claim.verdict(numbers([(x, x) for x in spread(0.5)])).verdict == "holds"
    assert claim.verdict(numbers([(x, x) for x in spread(0.62)])).verdict == "fails"
    assert claim.verdict(numbers([(x, x) for x in spread(0.5, width=0.1)])).verdict == "inconclusive"


def test_the_margin_is_the_sources_precision_and_training_is_only_observed(spread):
    v = claim.verdict(numbers([(x, x) for x in spread(0.5)], trained=((0.99, 0.99),) * 5))
    assert v.checks[0]["margin"]["origin"] == "source" and v.checks[0]["margin"]["value"] == 0.05
    assert len(v.checks) == 1 and "99% 99%" in v.observations[0]
