"""pre-vs-post-warmup's checks either side of 10 and 5 points; a diverged run counts as 0."""

from blocklab.lab.claims import pre_vs_post_warmup as claim


def numbers(post=(0.95, 0.1), pre=(0.95, 0.94)):
    return {
        "lr": 1e-3,
        "post": {"warmup": post[0], "no_warmup": post[1]},
        "pre": {"warmup": pre[0], "no_warmup": pre[1]},
    }


def test_post_norm_needs_warmup(threshold):
    threshold(claim.verdict, numbers(post=(0.95, 0.8499)), numbers(post=(0.95, 0.8501)), 0)
    threshold(claim.verdict, numbers(post=(0.95, None)), numbers(post=(0.95, 0.95)), 0)


def test_pre_norm_does_not(threshold):
    threshold(claim.verdict, numbers(pre=(0.95, 0.9001)), numbers(pre=(0.95, 0.8999)), 1)
