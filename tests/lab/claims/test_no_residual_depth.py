"""no-residual-depth's rules over seeds either side of 'trains' and 'fails', the degradation check, and
inconclusive when the shallow residual-free stack (the positive control) does not train."""

from blocklab.lab.claims import no_residual_depth as claim


def numbers(arm, add=((0.99,) * 3,) * 3, none=((0.95,) * 3, (0.2,) * 3, (0.1,) * 3)):
    return {
        "depths": [2, 10, 20],
        "add": [arm(list(a)) for a in add],
        "none": [arm(list(n)) for n in none],
        "first_block_grad": {"add": [0.1, 0.1, 0.1], "none": [2.0, 3.0, 4.0]},
        "trains_at": 0.9,
        "fails_below": 0.5,
    }


def test_textbook_numbers_hold(arm):
    v = claim.verdict(numbers(arm))
    assert v.verdict == "holds" and "gradient" in v.observations[0]  # the gradient is beside the verdict


def test_with_residuals_every_depth_trains_on_most_seeds(arm, threshold):
    inside = numbers(arm, add=((0.99,) * 3, (0.99,) * 3, (0.9, 0.9, 0.1)))
    outside = numbers(arm, add=((0.99,) * 3, (0.99,) * 3, (0.9, 0.8999, 0.1)))
    threshold(claim.verdict, inside, outside, 0)


def test_without_residuals_the_deepest_fails_on_most_seeds(arm, threshold):
    inside = numbers(arm, none=((0.95,) * 3, (0.2,) * 3, (0.4999, 0.4999, 0.9)))
    outside = numbers(arm, none=((0.95,) * 3, (0.2,) * 3, (0.4999, 0.5, 0.9)))
    threshold(claim.verdict, inside, outside, 1)


def test_without_residuals_the_deepest_ends_below_the_shallowest(arm, threshold):
    inside = numbers(arm, none=((0.95, 0.95, 0.2), (0.2,) * 3, (0.2, 0.2, 0.3)))
    outside = numbers(arm, none=((0.95, 0.2, 0.2), (0.2,) * 3, (0.2, 0.2, 0.3)))
    assert claim.verdict(inside).checks[2]["ok"] and not claim.verdict(outside).checks[2]["ok"]


def test_inconclusive_when_the_shallow_stack_without_residuals_does_not_train(arm):
    v = claim.verdict(numbers(arm, none=((0.95, 0.5, 0.5), (0.2,) * 3, (0.1,) * 3)))
    assert v.verdict == "inconclusive" and "depth 2 trains" in v.reason
