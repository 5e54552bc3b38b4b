"""pre-norm-depth's checks either side of 'trains' and '10 points below'."""

from blocklab.lab.claims import pre_norm_depth as claim


def numbers(pre=(0.9, 0.85), post=(0.9, 0.3)):
    return {"depths": [6, 48], "pre": list(pre), "post": list(post), "trains_at": 0.5}


def test_pre_norm_trains_at_every_depth(threshold):
    threshold(claim.verdict, numbers(pre=(0.9, 0.5)), numbers(pre=(0.9, 0.4999)), 0)


def test_post_norm_struggles_at_the_deepest(threshold):
    threshold(claim.verdict, numbers(post=(0.9, 0.7499)), numbers(post=(0.9, 0.7501)), 1)
    threshold(claim.verdict, numbers(post=(0.9, None)), numbers(post=(0.9, 0.9)), 1)
