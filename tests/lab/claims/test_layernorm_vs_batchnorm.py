"""layernorm-vs-batchnorm: at batch size 1 LayerNorm trains clearly above chance and beats BatchNorm, paired
by seed; inconclusive when LayerNorm does not reach the target at the largest batch."""

from blocklab.lab.claims import layernorm_vs_batchnorm as claim


def numbers(arm, spread, ln1=0.5, bn1=0.2, ln64=0.995):
    settings = {"1": (ln1, bn1), "8": (0.995, 0.995), "64": (ln64, 0.995), "padded": (0.995, 0.995)}
    make = lambda c: arm(spread(min(c, 0.995), width=0.002) if c >= 0.99 else spread(c))
    return {
        "settings": list(settings),
        "arms": {
            "standard": {s: make(ln) for s, (ln, _) in settings.items()},
            "batch": {s: make(bn) for s, (_, bn) in settings.items()},
        },
        "null": arm(spread(ln1, width=0.012)),
    }


def test_layernorm_works_at_batch_size_1_where_batchnorm_does_worse(arm, spread):
    v = claim.verdict(numbers(arm, spread))
    assert v.verdict == "holds" and [t["rule"] for t in v.checks] == ["beats", "beats"]
    assert "padded" in v.observations[0]


def test_fails_when_layernorm_stays_near_chance_or_batchnorm_does_as_well(arm, spread):
    assert claim.verdict(numbers(arm, spread, ln1=0.15, bn1=0.1)).checks[0]["outcome"] == "fails"
    assert claim.verdict(numbers(arm, spread, bn1=0.5)).checks[1]["outcome"] == "fails"


def test_inconclusive_when_layernorm_does_not_reach_the_target_at_the_largest_batch(arm, spread):
    assert claim.verdict(numbers(arm, spread, ln64=0.5)).verdict == "inconclusive"
