"""pre-norm-depth's rules over seeds: pre-norm trains at every depth, post-norm fails from depth 20 on;
inconclusive when the shallow post-norm stack (the source's baseline) does not train."""

from blocklab.lab.claims import pre_norm_depth as claim


def numbers(arm, pre=((0.9,) * 3,) * 3, post=((0.9,) * 3, (0.1,) * 3, (0.1,) * 3)):
    return {"depths": [6, 20, 30], "pre": [arm(list(a)) for a in pre], "post": [arm(list(a)) for a in post],
            "trains_at": 0.5}  # fmt: skip


def test_the_source_picture_holds(arm):
    assert claim.verdict(numbers(arm)).verdict == "holds"


def test_pre_norm_trains_at_every_depth_on_most_seeds(arm, threshold):
    inside = numbers(arm, pre=((0.9,) * 3, (0.9,) * 3, (0.5, 0.5, 0.1)))
    outside = numbers(arm, pre=((0.9,) * 3, (0.9,) * 3, (0.5, 0.4999, 0.1)))
    threshold(claim.verdict, inside, outside, 0)


def test_post_norm_fails_at_every_depth_from_20(arm, threshold):
    inside = numbers(arm, post=((0.9,) * 3, (0.4999, 0.4999, 0.9), (0.1,) * 3))
    outside = numbers(arm, post=((0.9,) * 3, (0.4999, 0.5, 0.9), (0.1,) * 3))
    threshold(claim.verdict, inside, outside, 1)
    assert not claim.verdict(numbers(arm, post=((0.9,) * 3, (0.1,) * 3, (None, 0.9, 0.9)))).checks[1]["ok"]


def test_inconclusive_when_shallow_post_norm_does_not_train(arm):
    v = claim.verdict(numbers(arm, post=((0.9, 0.3, 0.3), (0.1,) * 3, (0.1,) * 3)))
    assert v.verdict == "inconclusive"
