"""glu-variants' rules over seeds (each gated FFN below both ReLU and GELU), equal parameters, the gated
width, and inconclusive when an FFN does not learn."""

import math

from blocklab.lab.claims import glu_variants as claim


def numbers(relu=(2.0, 2.0, 2.0), gelu=(2.0, 2.0, 2.0), geglu=(1.9, 1.9, 1.9), swiglu=(1.9, 1.9, 1.9),
            params=(33088, 33088, 33044, 33044)):  # fmt: skip
    acts = ("relu", "gelu", "geglu", "swiglu")
    losses = dict(zip(acts, (list(relu), list(gelu), list(geglu), list(swiglu)), strict=True))
    lowest = {
        act: [None if x is None else x - 0.0 for x in xs] for act, xs in losses.items()
    }  # still falling
    return {
        "losses": losses,
        "lowest": lowest,
        "train_losses": losses,
        "ffn_parameters": dict(zip(acts, params, strict=True)),
        "vocab_size": 60,
    }


def test_the_source_picture_holds():
    assert claim.verdict(numbers()).verdict == "holds"


def test_each_gated_ffn_beats_both_plain_ones_on_most_seeds(threshold):
    threshold(claim.verdict, numbers(geglu=(1.9, 1.9, 2.5)), numbers(geglu=(1.9, 2.0, 2.5)), 0)
    threshold(
        claim.verdict,
        numbers(swiglu=(1.9, 1.9, 2.5)),
        numbers(swiglu=(1.9, 1.95, 2.5), gelu=(2.0, 1.95, 2.0)),
        1,
    )
    assert not claim.verdict(numbers(swiglu=(None, None, 1.0))).checks[1]["ok"]  # diverged: no win


def test_unequal_parameters_leave_the_claims_condition():
    assert claim.verdict(numbers(params=(1000, 1000, 1009, 1009))).verdict == "holds"
    assert claim.verdict(numbers(params=(1000, 1000, 1010, 1010))).verdict == "inconclusive"


def test_inconclusive_when_an_ffn_does_not_learn():
    uniform = math.log(60)
    assert claim.verdict(numbers(relu=(uniform + 0.1,) * 3)).verdict == "inconclusive"


def test_the_gated_ffns_get_two_thirds_of_the_width():
    assert claim.d_ff({"d_model": 64}, "relu") == 256 and claim.d_ff({"d_model": 64}, "swiglu") == 170


def test_inconclusive_when_an_ffn_overfits_before_the_budget():
    """The held-out loss rose from its lowest on most seeds: the run left the source's one-pass regime."""
    m = numbers()
    m["lowest"]["swiglu"] = [1.9, 1.8, 1.8]  # lower earlier on seeds 1 and 2: overfitting
    v = claim.verdict(m)
    assert v.verdict == "inconclusive" and "swiglu: 1 of 3 seeds" in v.reason
    m["lowest"]["swiglu"] = [1.9, 1.9, 1.8]  # on one seed only: most seeds still falling
    assert claim.verdict(m).verdict == "holds"
