"""no-residual-depth's checks either side of 'trains' and 'fails'."""

from blocklab.lab.claims import no_residual_depth as claim


def numbers(add=(0.99, 0.98, 0.97), none=(0.95, 0.2, None)):
    return {"depths": [2, 10, 20], "add": list(add), "none": list(none), "trains_at": 0.9, "fails_below": 0.5}


def test_textbook_numbers_hold():
    assert claim.verdict(numbers()).verdict == "holds"


def test_with_residuals_every_depth_trains(threshold):
    threshold(claim.verdict, numbers(add=(0.99, 0.98, 0.9)), numbers(add=(0.99, 0.98, 0.8999)), 0)


def test_without_residuals_the_shallowest_trains(threshold):
    threshold(claim.verdict, numbers(none=(0.9, 0.2, 0.1)), numbers(none=(0.8999, 0.2, 0.1)), 1)


def test_without_residuals_deeper_ones_fail(threshold):
    threshold(claim.verdict, numbers(none=(0.95, 0.4999, 0.1)), numbers(none=(0.95, 0.5, 0.1)), 2)
    threshold(claim.verdict, numbers(none=(0.95, 0.1, 0.4999)), numbers(none=(0.95, 0.1, 0.5)), 3)
