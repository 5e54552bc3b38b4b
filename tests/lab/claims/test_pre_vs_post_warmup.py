"""pre-vs-post-warmup: "needs": warmup raises post-norm's held-out accuracy and leaves pre-norm's, paired by
seed; inconclusive when post-norm with warmup does not train; the sweep over learning rates and inits."""

from blocklab.lab.claims import pre_vs_post_warmup as claim


def numbers(arm, spread, post=(0.95, 0.15), pre=(0.95, 0.95)):
    return {
        "lr": 1e-3,
        "warmup_steps": 100,
        "depth": 6,
        "curves": {},
        "post": {"warmup": arm(spread(post[0])), "no_warmup": arm(spread(post[1]))},
        "pre": {"warmup": arm(spread(pre[0])), "no_warmup": arm(spread(pre[1]))},
        "null": arm(spread(post[0], width=0.012)),
    }


def test_the_source_picture_holds(arm, spread):
    v = claim.verdict(numbers(arm, spread))
    assert v.verdict == "holds" and v.checks[0]["rule"] == "needs"


def test_fails_when_post_norm_trains_without_warmup_or_pre_norm_needs_it_too(arm, spread):
    assert claim.verdict(numbers(arm, spread, post=(0.95, 0.95))).verdict == "fails"
    assert claim.verdict(numbers(arm, spread, pre=(0.95, 0.15))).verdict == "fails"


def test_inconclusive_when_post_norm_with_warmup_does_not_train(arm, spread):
    assert claim.verdict(numbers(arm, spread, post=(0.12, 0.1))).verdict == "inconclusive"


def test_the_sweep_covers_four_learning_rates_with_the_sources_init_and_gpt2s():
    setups = {(s.init, s.train["lr"]): s.role for s in claim.CLAIM.setups}
    for init in ("xavier", "default"):
        assert sorted(lr for i, lr in setups if i == init) == [1e-3, 2e-3, 5e-3, 1e-2]
    assert setups[("xavier", 1e-3)] == "source" and list(setups.values()).count("source") == 1
