"""norm-lr-robustness's rule: a rate is good when most seeds reach the bar; LayerNorm must have more good
rates; a run at chance is not better than a diverged one; inconclusive when an arm never trains."""

from blocklab.lab.claims import norm_lr_robustness as claim


def numbers(arm, standard, none):
    return {"lrs": [1e-3, 1e-2, 1e-1], "standard": [arm(list(a)) for a in standard],
            "none": [arm(list(a)) for a in none], "trains_at": 0.9}  # fmt: skip


def test_more_learning_rates_reach_the_bar_on_most_seeds(arm, threshold):
    good, bad = (0.95,) * 3, (0.11, 0.12, 0.11)
    inside = numbers(arm, (good, good, (0.9, 0.9, 0.1)), (good, good, bad))
    outside = numbers(arm, (good, good, (0.9, 0.8999, 0.1)), (good, good, bad))
    threshold(claim.verdict, inside, outside, 0)


def test_chance_is_not_better_than_diverged(arm):
    good = (0.95,) * 3
    v = claim.verdict(numbers(arm, (good, good, (0.12, 0.11, 0.13)), (good, good, (None, None, None))))
    assert v.verdict == "fails"
    assert "diverged runs over the sweep: LayerNorm 0, no norm 3" in v.observations[0]


def test_inconclusive_when_an_arm_trains_at_no_rate(arm):
    never = ((0.5,) * 3,) * 3
    assert claim.verdict(numbers(arm, ((0.95,) * 3,) * 3, never)).verdict == "inconclusive"
    assert claim.verdict(numbers(arm, never, ((0.95,) * 3,) * 3)).verdict == "inconclusive"
