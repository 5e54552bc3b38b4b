"""What a claim is made of: tests and controls to a setup's verdict (with its sensitivity), the setups'
verdicts to the claim's (the source decides; a confound can make it depend; a sweep never decides),
validated setups and sources, and a setup's init reaching the weights it trains."""

import dataclasses

import pytest
import torch

from blocklab.lab.claims import CLAIMS, Setup, Source, Test, combine, from_tests
from blocklab.lab.claims import relu_sparsity as a_training_claim
from blocklab.lab.claims.base import seed_count, sensitivity_of, setup_verdict
from blocklab.lab.claims.shared import NULL_SEED, fresh_model, run_spec
from blocklab.nn.config import ModelConfig
from blocklab.nn.model import Transformer
from blocklab.nn.presets import preset


def made(check="a", outcome="holds", **neighbours):
    return Test(check, "beats", outcome, None, None, neighbours)


def test_a_setup_holds_when_every_test_holds_and_fails_when_one_fails():
    assert setup_verdict(["holds", "holds"]) == "holds"
    assert setup_verdict(["holds", "fails", "inconclusive"]) == "fails"
    assert setup_verdict(["holds", "inconclusive"]) == "inconclusive"
    v = from_tests([made("a is 1"), made("b is 2", "fails"), made("c is 3", "inconclusive")])
    assert v.verdict == "fails" and v.reason == "holds: a is 1; fails: b is 2; undecided: c is 3"
    assert v.checks[1] == {
        "check": "b is 2",
        "rule": "beats",
        "outcome": "fails",
        "effect": None,
        "margin": None,
        "neighbours": {},
    }
    with pytest.raises(ValueError):
        from_tests([])


def test_a_failed_control_makes_the_setup_inconclusive_whatever_its_tests():
    kept = from_tests([made()], controls=[("the control trains", True)], observations=["seen"])
    assert (kept.verdict, kept.observations) == ("holds", ["seen"])
    broken = from_tests([made(), made("b", "fails")], controls=[("the control trains", False), ("c", True)])
    assert broken.verdict == "inconclusive"
    assert broken.reason == "a control failed (the control trains), so the tests do not count"
    assert [t["outcome"] for t in broken.checks] == ["holds", "fails"]  # still shown
    assert broken.controls[0] == {"check": "the control trains", "ok": False}


def test_the_sensitivity_recomputes_the_setups_verdict_under_each_neighbour():
    tests = [
        made("a", "holds", **{"margin x2": "fails", "half the budget": "holds"}),
        made("b", "holds", **{"margin x2": "holds"}),
    ]
    s = sensitivity_of("holds", tests)
    assert s == {
        "label": "fragile",
        "neighbours": {"margin x2": "fails", "half the budget": "holds"},
        "flips": ["margin x2"],
    }
    assert sensitivity_of("holds", [made("a", "holds", **{"margin x0.5": "holds"})])["label"] == "robust"
    assert from_tests(tests).sensitivity["label"] == "fragile"
    with pytest.raises(ValueError, match="outcomes are"):
        Test("a", "beats", "partly", None, None, {})
    with pytest.raises(ValueError, match="rule='guess'"):
        Test("a", "guess", "holds", None, None, {})


@pytest.mark.parametrize(
    "oks, counts",
    [
        ([True, True, False], (True, "2 of 3 seeds")),
        ([True, False], (False, "1 of 2 seeds")),  # a tie is not most seeds
        ([True, True, True, False, False], (True, "3 of 5 seeds")),
        ([True, True, False, False, False], (False, "2 of 5 seeds")),
    ],
)
def test_a_control_over_seeds_counts_when_true_on_more_than_half(oks, counts):
    assert seed_count(oks) == counts


def test_the_source_setup_decides_and_a_disagreeing_confound_makes_the_claim_depend():
    assert combine([("exact", "exact", "fails")]) == ("fails", "fails in its only setup")
    assert combine([("paper", "source", "holds"), ("learned", "confound", "holds")]) == (
        "holds",
        "holds in the source setup (paper); confounds: learned holds",
    )
    verdict, reason = combine(
        [("paper", "source", "holds"), ("learned", "confound", "fails"), ("x", "confound", "inconclusive")]
    )
    assert verdict == "depends" and reason.startswith(
        "holds in the source setup (paper), the opposite in learned"
    )
    with pytest.raises(ValueError, match="'maybe' is not one of"):
        combine([("paper", "source", "maybe")])
    with pytest.raises(ValueError, match="exactly one source"):
        combine([("a", "confound", "holds")])


def test_a_confound_never_decides_an_inconclusive_source_and_a_sweep_never_decides():
    verdict, reason = combine([("paper", "source", "inconclusive"), ("other", "confound", "holds")])
    assert verdict == "inconclusive" and "no other setup decides in its place" in reason
    verdict, reason = combine([("paper", "source", "fails"), ("lr-1e-2", "sweep", "holds")])
    assert verdict == "fails" and reason.endswith("sweeps: lr-1e-2 holds")


def test_a_source_says_which_words_its_test_reads():
    with pytest.raises(ValueError, match="say which words"):
        Source("a", "b", "c", " ")
    assert Source("a", "b", "c", "d").to_dict()["reads"] == "d"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"role": "main"}, "role='main' is not one of"),
        ({"model": {"d_modle": 8}}, "'d_modle' is not a ModelConfig field"),
        ({"model": {"init": "xavier"}}, "the init scheme is the setup's init, not a model field"),
        ({"train": {"lrr": 1.0}}, "'lrr' is not a TrainConfig field"),
        ({"train": {"seed": 1}}, "seeds are the claim's sizes"),
        ({"init": "kaiming"}, "init='kaiming' is not one of: default, xavier"),
    ],
)
def test_a_setup_refuses_what_cannot_apply(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Setup(**{"name": "s", "role": "source", "why": "because it is", **kwargs})


def test_a_confound_is_its_source_but_for_what_it_names():
    source = Setup("paper", "source", "the paper's", train={"lr": 1e-3}, init="xavier")
    confound = source.but("learned", "learned positions", model={"pos_encoding": "learned"})
    assert (confound.role, confound.model, confound.train, confound.init) == (
        "confound", {"pos_encoding": "learned"}, {"lr": 1e-3}, "xavier",
    )  # fmt: skip
    assert Setup("s", "source", "blocklab's own").init == ModelConfig().init == "torch"


def test_a_claim_refuses_setups_that_cannot_apply():
    claim = a_training_claim.CLAIM
    source = claim.setups[0]
    with pytest.raises(ValueError, match="one 'source' setup and at least one 'confound'"):
        dataclasses.replace(claim, setups=(source,))
    with pytest.raises(ValueError, match="distinct names"):
        dataclasses.replace(claim, setups=(source, source.but(source.name, "same name")))
    with pytest.raises(ValueError, match="training claims, and only they, have runs"):
        dataclasses.replace(claim, runs=None)
    with pytest.raises(ValueError, match="Source.setup key 'batch'"):
        Source("a", "b", "c", "d", {"batch": "64"})


def test_a_run_is_the_claims_sizes_then_the_setup_then_the_run():
    setup = Setup("s", "source", "a setup", model={"pos_encoding": "learned"}, train={"lr": 1e-3}, init="he")
    sizes = {"d_model": 32, "steps": 200, "lr": 1e-2, "warmup": 500, "batch_size": 64, "seeds": 2}
    spec = run_spec("claim", setup, "x/L2", sizes, {"n_layers": 2}, seed=1, batch_size=8)
    assert spec.key == "claim/s/x/L2/s1" and spec.task == {"name": "listops"}
    assert spec.model == {
        "d_model": 32, "d_ff": 128, "n_heads": 4, "pos_encoding": "learned", "n_layers": 2, "init": "he",
    }  # fmt: skip
    assert (spec.train["lr"], spec.train["batch_size"], spec.train["steps"], spec.train["seed"]) == (
        1e-3, 8, 200, 1,
    )  # fmt: skip
    assert spec.train["warmup"] == 200  # never longer than the run
    assert spec.train["target_accuracy"] == 0.99 and spec.train["eval_every"] == 25
    with pytest.raises(ValueError, match="sets TrainConfig field 'lr', which the claim itself varies"):
        run_spec("claim", setup, "x", sizes, lr=1e-2)
    with pytest.raises(ValueError, match="sets ModelConfig field 'pos_encoding'"):
        run_spec("claim", setup, "x", sizes, {"pos_encoding": "sinusoidal"})


def _block_weight_std(model: torch.nn.Module) -> float:
    """The std of the first block's FFN W1, a (d_ff, d_model) matrix."""
    return float(model.blocks[0].ffn.w1.weight.detach().std())


@pytest.mark.parametrize("init, std", [("xavier", (2 / (64 + 256)) ** 0.5), ("torch", (3 * 64) ** -0.5)])
def test_a_setup_with_an_init_trains_and_measures_weights_drawn_by_it(init, std):
    """The model a training run builds from the setup's spec, and the fresh model an init claim measures,
    have the init's variance (W1 is 256 x 64: 65,536 draws, so the std is within 1%)."""
    setup = Setup("s", "source", "a setup", init=init)
    sizes = {"d_model": 64, "steps": 10, "lr": 1e-3, "warmup": 0, "batch_size": 8, "seeds": 1}
    spec = run_spec("claim", setup, "x", sizes)
    trained = Transformer(preset(spec.preset, **spec.model))  # as grid.run_one builds it
    assert _block_weight_std(trained) == pytest.approx(std, rel=0.01)
    assert _block_weight_std(fresh_model(sizes, setup, 0)) == pytest.approx(std, rel=0.01)


@pytest.mark.parametrize("claim", [c for c in CLAIMS if c.runs], ids=lambda c: c.name)
def test_no_setup_sets_what_its_claim_varies(claim):
    for setup in claim.setups:  # run_spec raises on a field both set
        for size in (claim.quick, claim.full):
            specs = claim.runs(size, setup)
            seeds = set(range(size["seeds"]))
            assert specs and {s.train["seed"] for s in specs} - {NULL_SEED + s for s in seeds} == seeds
            assert all(s.model["init"] == setup.init for s in specs)
