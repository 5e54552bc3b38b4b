"""norm-lr-robustness: "needs", one test per higher rate: LayerNorm's effect is present at 5x and 30x the
base rate and absent at it; inconclusive when LayerNorm does not train at the base rate."""

from blocklab.lab.claims import norm_lr_robustness as claim

LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]


def numbers(arm, spread, ln=(0.95, 0.95, 0.95, 0.95, 0.95), none=(0.95, 0.95, 0.2, 0.2, None)):
    diverged = lambda c: arm([None] * 5) if c is None else arm(spread(c))
    return {
        "lrs": LRS,
        "base_lr": 3e-3,
        "higher": [1e-2, 1e-1],
        "trains_at": 0.9,
        "standard": [diverged(c) for c in ln],
        "none": [diverged(c) for c in none],
        "null": arm(spread(ln[1], width=0.012)),
    }


def test_normalization_enabling_higher_rates_holds_and_a_diverged_run_counts_zero(arm, spread):
    v = claim.verdict(numbers(arm, spread))
    assert v.verdict == "holds" and len(v.checks) == 2 and "no norm 5" in v.observations[0]


def test_fails_when_no_norm_trains_at_a_higher_rate_too(arm, spread):
    v = claim.verdict(numbers(arm, spread, none=(0.95, 0.95, 0.95, 0.2, 0.2)))
    assert v.verdict == "fails" and [t["outcome"] for t in v.checks] == ["fails", "holds"]


def test_inconclusive_when_layernorm_does_not_train_at_the_base_rate(arm, spread):
    assert claim.verdict(numbers(arm, spread, ln=(0.95, 0.5, 0.95, 0.95, 0.95))).verdict == "inconclusive"
