"""gelu-vs-relu: GELU's steps to the target match or beat ReLU's (non-inferiority, paired by seed), the margin
ReLU's seed noise and never below one evaluation; inconclusive when neither activation trains."""

from blocklab.lab.claims import gelu_vs_relu as claim


def numbers(
    arm, relu=(100, 125, 150, 175, 200), gelu=(100, 125, 150, 175, 200), null=(100, 150, 125, 200, 175)
):
    acc = lambda steps: [0.5 if s is None else 0.995 for s in steps]
    return {
        "relu": arm(acc(relu), list(relu)),
        "gelu": arm(acc(gelu), list(gelu)),
        "null": arm(acc(null), list(null)),
        "time_ratio": 1.1,
    }


def test_gelu_as_fast_as_relu_holds(arm):
    v = claim.verdict(numbers(arm))
    assert v.verdict == "holds" and v.checks[0]["rule"] == "at least"
    assert "1.10x" in v.observations[0]  # the cost is shown, not scored


def test_gelu_clearly_slower_fails_and_a_run_never_reaching_the_target_counts_one_evaluation_past_the_budget(
    arm,
):
    slow = numbers(arm, gelu=(400, 425, 450, 475, 500))
    assert claim.verdict(slow).verdict == "fails"
    never = numbers(arm, gelu=(None,) * 5)
    assert claim.verdict(never).checks[0]["effect"]["mean"] == 625 - 150  # 600 + one evaluation, against 150


def test_one_slower_seed_within_the_noise_is_not_a_failure(arm):
    v = claim.verdict(numbers(arm, gelu=(100, 125, 150, 175, 250)))
    assert v.verdict in ("holds", "inconclusive") and v.checks[0]["margin"]["value"] >= 25


def test_inconclusive_when_neither_activation_reaches_the_target(arm):
    v = claim.verdict(numbers(arm, relu=(None, None, None, 100, 100), gelu=(None, None, 100, None, None)))
    assert v.verdict == "inconclusive" and "control" in v.reason
