"""glu-variants: each gated FFN's lowest held-out loss beats each plain FFN's, paired by seed, the margin
ReLU's seed noise; equal parameters and learning as controls; the gated width."""

import math

from blocklab.lab.claims import glu_variants as claim

ACTS = ("relu", "gelu", "geglu", "swiglu")


def numbers(arm, spread, relu=2.0, gelu=2.0, geglu=1.9, swiglu=1.9, params=(33088, 33088, 33044, 33044)):
    centres = dict(zip(ACTS, (relu, gelu, geglu, swiglu), strict=True))
    arms = {act: arm([0.5] * 5, loss=spread(c)) for act, c in centres.items()}
    return {
        "arms": arms,
        "null": arm([0.5] * 5, loss=spread(relu, width=0.012)),
        "losses": {a: x["readings"]["loss"]["final"] for a, x in arms.items()},
        "lowest": {a: x["readings"]["loss"]["final"] for a, x in arms.items()},
        "train_losses": {a: x["readings"]["loss"]["final"] for a, x in arms.items()},
        "ffn_parameters": dict(zip(ACTS, params, strict=True)),
        "vocab_size": 60,
    }


def test_gated_below_both_plain_holds_and_each_pair_is_a_test(arm, spread):
    v = claim.verdict(numbers(arm, spread))
    assert v.verdict == "holds" and len(v.checks) == 4 and {t["rule"] for t in v.checks} == {"beats"}
    assert v.checks[0]["margin"]["origin"] == "seed noise"


def test_a_gated_ffn_above_a_plain_one_fails_the_claim(arm, spread):
    v = claim.verdict(numbers(arm, spread, swiglu=2.1))
    assert v.verdict == "fails" and [t["outcome"] for t in v.checks] == ["holds", "holds", "fails", "fails"]


def test_a_difference_inside_the_noise_is_no_win(arm, spread):
    assert claim.verdict(numbers(arm, spread, geglu=2.0, swiglu=2.0)).verdict == "fails"


def test_unequal_parameters_or_an_ffn_that_does_not_learn_make_it_inconclusive(arm, spread):
    assert claim.verdict(numbers(arm, spread, params=(1000, 1000, 1009, 1009))).verdict == "holds"
    assert claim.verdict(numbers(arm, spread, params=(1000, 1000, 1010, 1010))).verdict == "inconclusive"
    assert claim.verdict(numbers(arm, spread, relu=math.log(60) + 0.1)).verdict == "inconclusive"


def test_the_gated_ffns_get_two_thirds_of_the_width():
    assert claim.d_ff({"d_model": 64}, "relu") == 256 and claim.d_ff({"d_model": 64}, "swiglu") == 170
