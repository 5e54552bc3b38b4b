"""rmsnorm-vs-layernorm: RMSNorm's steps to the target match LayerNorm's, paired by seed, the margin
LayerNorm's seed noise and at least one evaluation; inconclusive when LayerNorm does not train."""

from blocklab.lab.claims import rmsnorm_vs_layernorm as claim


def numbers(arm, ln=(100, 125, 150, 175, 200), rms=(100, 125, 150, 175, 200), null=(125, 100, 175, 150, 200)):
    acc = lambda steps: [0.5 if s is None else 0.995 for s in steps]
    return {
        "standard": arm(acc(ln), list(ln)),
        "rms": arm(acc(rms), list(rms)),
        "null": arm(acc(null), list(null)),
    }


def test_comparable_steps_hold(arm):
    v = claim.verdict(numbers(arm))
    assert v.verdict == "holds" and v.checks[0]["rule"] == "matches"


def test_clearly_slower_fails_and_noisy_is_inconclusive(arm):
    assert claim.verdict(numbers(arm, rms=(300, 325, 350, 375, 400))).verdict == "fails"
    assert claim.verdict(numbers(arm, rms=(100, 300, 150, 400, 200))).verdict == "inconclusive"


def test_inconclusive_when_layernorm_does_not_reach_the_target(arm):
    assert claim.verdict(numbers(arm, ln=(None, None, None, 100, 100))).verdict == "inconclusive"
