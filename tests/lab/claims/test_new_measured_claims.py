"""The init, pretrained and training claims the tutorials' statements became (issue 36): each verdict on
synthetic per-seed numbers either side of its rule, and the measurements where they are cheap."""

import math

import pytest
import torch

from blocklab.lab.claims import (
    attention_distance,
    embedding_gradient,
    expansion_ratio,
    gelu_dead_neurons,
    layernorm_whitens,
    pre_norm_small_data,
    residual_growth,
    rmsnorm_cost,
)


def rev(xs):
    return list(reversed(xs))


def test_embedding_gradient_post_above_pre(spread):
    m = {"depth": 6, "post": spread(0.3), "pre": spread(0.0), "null": rev(spread(0.3, width=0.012))}
    assert embedding_gradient.verdict(m).verdict == "holds"
    m["post"], m["null"] = spread(0.0), rev(spread(0.0, width=0.012))
    assert embedding_gradient.verdict(m).verdict == "fails"


def test_embedding_gradient_measures_the_same_weights_in_both_positions():
    sizes = {"d_model": 16, "batch": 4, "depth": 2, "seeds": 2}
    setup = embedding_gradient.CLAIM.setups[0]
    post, pre = (
        embedding_gradient.stack(sizes, setup, 0, "post"),
        embedding_gradient.stack(sizes, setup, 0, "pre"),
    )
    shared = post.state_dict()
    assert all(torch.equal(v, pre.state_dict()[k]) for k, v in shared.items()) and len(shared) > 10
    assert embedding_gradient.stack(sizes, setup, 1, "post").embed.weight.ne(post.embed.weight).any()
    m = embedding_gradient.measure(sizes, setup, {})
    assert all(math.isfinite(x) for x in m["post"] + m["pre"] + m["null"])


def test_residual_growth_grows_without_a_norm_and_stays_with_post_norm(spread):
    arm = lambda c: {"log10_growth": spread(c), "null": rev(spread(c, width=0.012)), "profile": [1.0, 2.0]}
    m = {"depth": 12, "no norm": arm(0.5), "post-norm": arm(0.0), "pre-norm": arm(0.4)}
    assert residual_growth.verdict(m).verdict == "holds"
    m["post-norm"] = arm(0.5)
    assert residual_growth.verdict(m).verdict == "fails"


def test_layernorm_whitens_fails_when_correlations_stay_and_holds_at_the_floor(spread):
    rows = lambda after: [
        {"before": 0.3, "after": a, "whitened": w}
        for a, w in zip(spread(after), spread(0.0125, width=0.0005), strict=True)
    ]
    m = {"rows": rows(0.25), "null_whitened": rev(spread(0.0125, width=0.0006))}
    assert layernorm_whitens.verdict(m).verdict == "fails"
    m["rows"] = [{"before": 0.3, "after": r["whitened"] + 1e-5, "whitened": r["whitened"]} for r in rows(0.0)]
    assert layernorm_whitens.verdict(m).verdict == "holds"


def test_layernorm_keeps_the_correlation_of_features_it_does_not_mix():
    """An independent oracle: with no offset, LayerNorm rescales each position by one number, so correlated
    features stay correlated, far above the floor of independent ones."""
    row = layernorm_whitens.draw({"positions": 2048, "d_model": 16}, 0)
    assert row["after"] > 3 * row["whitened"]


def test_attention_distance_last_above_first(spread):
    row = lambda first, last: {"distance": [first, 2.0, last], "special_share": [0.1, 0.2, 0.3]}
    m = {
        "rows": [row(a, b) for a, b in zip(spread(1.0, 0.1), spread(3.0, 0.1), strict=True)],
        "null": [row(f, 1.0) for f in rev(spread(1.0, 0.12))],
    }
    assert attention_distance.verdict(m).verdict == "holds"
    m["rows"] = [row(f, f) for f in spread(1.0, 0.1)]
    assert attention_distance.verdict(m).verdict == "fails"


def test_attention_distance_of_uniform_attention_by_hand():
    """A passage's mean distance: with T tokens attending uniformly, sum_j |i - j| / T averaged over i."""
    d = attention_distance.passage_distances("hello world")
    assert len(d["distance"]) == 6 and all(0 < x < 10 for x in d["distance"])
    assert all(0 <= s <= 1 for s in d["special_share"])


def test_rmsnorm_cost_beats_by_more_than_the_sources_smallest_saving():
    ln = [1.0, 1.1, 0.9, 1.05, 0.95]
    faster = {"seconds": {"ln": ln, "rms": [t * 0.5 for t in ln]}}
    slower = {"seconds": {"ln": ln, "rms": [t * 3.0 for t in ln]}}
    barely = {"seconds": {"ln": ln, "rms": [t * 0.96 for t in ln]}}  # 4% faster, every rep: still faster
    assert rmsnorm_cost.verdict(faster).verdict == "holds"
    assert rmsnorm_cost.verdict(slower).verdict == "fails"
    assert rmsnorm_cost.verdict(barely).verdict == "holds"  # beats needs the interval above 0, not the margin
    same = {
        "seconds": {"ln": ln, "rms": [t * s for t, s in zip(ln, (1.01, 0.99, 1.0, 1.01, 0.99), strict=True)]}
    }
    assert rmsnorm_cost.verdict(same).verdict == "fails"  # inside the margin: no reduction worth the word
    assert rmsnorm_cost.SAVING.value == pytest.approx(-math.log(0.93))


def test_rmsnorm_cost_measures_each_implementation():
    for setup in rmsnorm_cost.CLAIM.setups:
        m = rmsnorm_cost.measure({"d_model": 32, "tokens": 16, "reps": 2}, setup, {})
        assert len(m["seconds"]["ln"]) == len(m["seconds"]["rms"]) == 2


def test_gelu_dead_neurons(spread):
    m = {
        "units": 512,
        "relu": {"dead": spread(0.2), "accuracy": [0.99] * 5},
        "gelu": {"dead": spread(0.05), "accuracy": [0.99] * 5},
        "null": rev(spread(0.2, width=0.012)),
    }
    assert gelu_dead_neurons.verdict(m).verdict == "holds"
    m["relu"]["dead"], m["gelu"]["dead"], m["null"] = (
        [0.0] * 5,
        [0.0] * 5,
        [0.0] * 5,
    )  # none dead: no difference
    v = gelu_dead_neurons.verdict(m)
    assert v.verdict == "fails" and v.checks[0]["margin"]["value"] == pytest.approx(1 / 512)


def test_expansion_ratio(arm, spread):
    def make(train, overfit, seconds):
        a = arm([0.5] * 5, train_loss=spread(train), seconds=[600 * s for s in spread(seconds, 0.001)])
        return {**a, "overfit": spread(overfit)}

    m = {
        "x2": make(1.5, 0.0, 0.010),
        "x4": make(1.3, 0.05, 0.012),
        "x8": make(1.2, 0.2, 0.020),
        "x4/null": {**make(1.3, 0.05, 0.012), "overfit": rev(spread(0.05, 0.012))},
    }
    m["x4/null"]["readings"]["train_loss"]["final"] = rev(spread(1.3, 0.012))
    assert [t["outcome"] for t in expansion_ratio.verdict(m).checks] == ["holds", "holds", "holds"]
    m["x8"] = make(1.2, 0.05, 0.012)
    assert [t["outcome"] for t in expansion_ratio.verdict(m).checks][1:] == ["fails", "fails"]


def test_pre_norm_small_data(arm, spread):
    make = lambda train, held: arm([0.5] * 5, train_loss=spread(train), loss=spread(held))
    m = {"n_train": 64, "post": make(1.0, 2.0), "pre": make(1.3, 2.3), "null": make(1.0, 2.0)}
    m["null"]["readings"]["train_loss"]["final"] = rev(spread(1.0, 0.012))
    m["null"]["readings"]["loss"]["final"] = rev(spread(2.0, 0.012))
    assert pre_norm_small_data.verdict(m).verdict == "holds"
    m["pre"] = make(0.9, 1.9)
    assert pre_norm_small_data.verdict(m).verdict == "fails"
