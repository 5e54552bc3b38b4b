"""norm-lr-robustness's checks either side of 'more learning rates' and 'higher worst'."""

from blocklab.lab.claims import norm_lr_robustness as claim


def numbers(standard, none):
    return {"lrs": [1e-3, 1e-2, 1e-1], "standard": list(standard), "none": list(none), "trains_at": 0.9}


def test_more_learning_rates_reach_the_bar(threshold):
    inside = numbers((0.9, 0.95, 0.5), (0.89, 0.95, 0.4))
    outside = numbers((0.8999, 0.95, 0.5), (0.89, 0.95, 0.4))
    threshold(claim.verdict, inside, outside, 0)


def test_worst_accuracy_higher(threshold):
    inside = numbers((0.9, 0.95, 0.41), (0.5, 0.95, 0.4))
    outside = numbers((0.9, 0.95, 0.4), (0.5, 0.95, 0.4))
    threshold(claim.verdict, inside, outside, 1)


def test_a_diverged_run_counts_as_zero():
    assert claim.good([0.95, None, float("nan")], 0.9) == 1
