"""no-residual-depth: "needs": the residual's effect on held-out accuracy is present at the deepest depth
and absent at the shallowest, paired by seed; inconclusive when the shallow residual-free stack (the
positive control) does not train."""

from blocklab.lab.claims import no_residual_depth as claim


def numbers(arm, spread, none_deep=0.1, none_shallow=0.95, add=0.95):
    return {
        "depths": [2, 10, 20],
        "add": [arm(spread(add)) for _ in range(3)],
        "none": [arm(spread(none_shallow)), arm(spread(0.2)), arm(spread(none_deep))],
        "null": arm(spread(add, width=0.012)),
        "first_block_grad": {"add": [0.1, 0.1, 0.1], "none": [2.0, 3.0, 4.0]},
        "trains_at": 0.9,
    }


def test_the_degradation_problem_holds(arm, spread):
    v = claim.verdict(numbers(arm, spread))
    assert v.verdict == "holds" and v.checks[0]["rule"] == "needs" and "gradient" in v.observations[0]


def test_fails_when_depth_does_not_hurt_the_plain_stack_or_the_shallow_one_needs_residuals(arm, spread):
    assert claim.verdict(numbers(arm, spread, none_deep=0.95)).verdict == "fails"
    assert claim.verdict(numbers(arm, spread, add=0.99, none_shallow=0.91, none_deep=0.1)).verdict != "holds"


def test_inconclusive_when_the_shallow_stack_without_residuals_does_not_train(arm, spread):
    v = claim.verdict(numbers(arm, spread, none_shallow=0.5))
    assert v.verdict == "inconclusive" and "depth 2 trains" in v.reason
