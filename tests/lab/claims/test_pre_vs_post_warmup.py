"""pre-vs-post-warmup's rule over seeds: post-norm without warmup misses the target on most seeds,
pre-norm without warmup reaches it on most; inconclusive when post-norm with warmup does not train."""

from blocklab.lab.claims import pre_vs_post_warmup as claim

HIT, MISS = 0.995, 0.5  # reached the 99% target / ended below it


def numbers(arm, post=(HIT, MISS), pre=(HIT, HIT), post_no=None, pre_no=None, post_warm=None):
    return {
        "lr": 1e-2,
        "post": {"warmup": arm(post_warm or [post[0]] * 3), "no_warmup": arm(post_no or [post[1]] * 3)},
        "pre": {"warmup": arm([pre[0]] * 3), "no_warmup": arm(pre_no or [pre[1]] * 3)},
    }


def test_the_source_picture_holds(arm):
    assert claim.verdict(numbers(arm)).verdict == "holds"


def test_post_norm_without_warmup_misses_on_most_seeds(arm, threshold):
    inside, outside = numbers(arm, post_no=[HIT, MISS, None]), numbers(arm, post_no=[HIT, HIT, MISS])
    threshold(claim.verdict, inside, outside, 0)


def test_pre_norm_without_warmup_reaches_on_most_seeds(arm, threshold):
    threshold(claim.verdict, numbers(arm, pre_no=[HIT, HIT, MISS]), numbers(arm, pre_no=[HIT, MISS, None]), 1)


def test_a_post_norm_that_cannot_train_even_with_warmup_is_inconclusive(arm):
    assert claim.verdict(numbers(arm, post_warm=[HIT, HIT, MISS])).verdict == "holds"
    v = claim.verdict(numbers(arm, post_warm=[HIT, MISS, None]))
    assert v.verdict == "inconclusive" and "1 of 3 seeds" in v.reason


def test_every_setup_is_inside_the_claims_high_learning_rate():
    """issue 25: a setup at the paper's 1e-3 scored a claim conditional on a high rate."""
    full = claim.CLAIM.full
    assert all(s.train.get("lr", full["lr"]) >= 1e-2 for s in claim.CLAIM.setups)
