"""gelu-vs-relu's rule over seeds: GELU reaches the target in at most ReLU's steps seed by seed (a run
that never reaches it counts as infinitely many), a small extra cost; inconclusive when neither trains."""

from blocklab.lab.claims import gelu_vs_relu as claim


def numbers(arm, relu=(100, 150, 200), gelu=(100, 150, 200), ratio=1.1):
    acc = lambda steps: [0.5 if s is None else 0.995 for s in steps]
    return {"relu": arm(acc(relu), list(relu)), "gelu": arm(acc(gelu), list(gelu)), "time_ratio": ratio}


def test_gelu_as_fast_on_most_seeds(arm, threshold):
    threshold(claim.verdict, numbers(arm, gelu=(100, 150, 225)), numbers(arm, gelu=(125, 150, 225)), 0)


def test_a_gelu_run_that_never_reaches_the_target_is_slower(arm, threshold):
    threshold(claim.verdict, numbers(arm, gelu=(75, 150, None)), numbers(arm, gelu=(125, 150, None)), 0)
    assert claim.verdict(numbers(arm, relu=(None, None, 200), gelu=(None, None, 200))).checks[0]["ok"]


def test_small_extra_cost(arm, threshold):
    threshold(claim.verdict, numbers(arm, ratio=1.5), numbers(arm, ratio=1.51), 1)


def test_inconclusive_when_neither_activation_reaches_the_target(arm):
    v = claim.verdict(numbers(arm, relu=(None, None, 100), gelu=(None, 100, None)))
    assert v.verdict == "inconclusive"
    one_trains = numbers(arm, relu=(None, None, 100), gelu=(None, 100, 100))
    assert claim.verdict(one_trains).verdict != "inconclusive"
