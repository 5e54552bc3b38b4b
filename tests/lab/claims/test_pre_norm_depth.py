"""pre-norm-depth: "needs", one test per depth from the source's 20 on: pre-norm's effect on held-out
accuracy is present there and absent at the shallowest; inconclusive when shallow post-norm does not train."""

from blocklab.lab.claims import pre_norm_depth as claim


def numbers(arm, spread, post=(0.95, 0.15, 0.15), pre=(0.95, 0.95, 0.95)):
    return {
        "depths": [6, 20, 30],
        "deep": 20,
        "trains_at": 0.5,
        "pre": [arm(spread(c)) for c in pre],
        "post": [arm(spread(c)) for c in post],
        "null": arm(spread(post[0], width=0.012)),
    }


def test_the_source_picture_holds_with_a_test_per_deep_depth(arm, spread):
    v = claim.verdict(numbers(arm, spread))
    assert v.verdict == "holds" and len(v.checks) == 2


def test_fails_when_post_norm_trains_at_depth_20(arm, spread):
    v = claim.verdict(numbers(arm, spread, post=(0.95, 0.95, 0.15)))
    assert v.verdict == "fails" and [t["outcome"] for t in v.checks] == ["fails", "holds"]


def test_inconclusive_when_post_norm_does_not_train_at_the_shallowest_depth(arm, spread):
    assert claim.verdict(numbers(arm, spread, post=(0.3, 0.15, 0.15))).verdict == "inconclusive"
