"""What a claim is made of: checks, controls and seed counts to verdicts, setups' verdicts to the claim's
(inconclusive setups left out), validated setups, and a setup's init reaching the weights it trains."""

import dataclasses

import pytest
import torch

from blocklab.lab.claims import CLAIMS, Setup, Source, combine, from_checks
from blocklab.lab.claims import relu_sparsity as a_training_claim
from blocklab.lab.claims.base import seed_count
from blocklab.lab.claims.shared import fresh_model, run_spec
from blocklab.nn.config import ModelConfig
from blocklab.nn.model import Transformer
from blocklab.nn.presets import preset


def test_verdict_from_checks_and_its_reason():
    assert from_checks([("a", True), ("b", True)]).verdict == "holds"
    assert from_checks([("a", False)]).verdict == "fails"
    v = from_checks([("a is 1", True), ("b is 2", False)])
    assert v.verdict == "partly" and v.reason == "true: a is 1; not true: b is 2"
    assert v.checks == [{"check": "a is 1", "ok": True}, {"check": "b is 2", "ok": False}]
    with pytest.raises(ValueError):
        from_checks([])


def test_a_failed_control_makes_the_setup_inconclusive_whatever_its_checks():
    kept = from_checks([("a", True)], controls=[("the control trains", True)], observations=["seen"])
    assert (kept.verdict, kept.observations) == ("holds", ["seen"])
    broken = from_checks([("a", True), ("b", False)], controls=[("the control trains", False), ("c", True)])
    assert broken.verdict == "inconclusive"
    assert broken.reason == "a control failed (the control trains), so the checks do not count"
    assert broken.checks == [{"check": "a", "ok": True}, {"check": "b", "ok": False}]  # still shown
    assert broken.controls[0] == {"check": "the control trains", "ok": False}


@pytest.mark.parametrize(
    "oks, counts",
    [
        ([True, True, False], (True, "2 of 3 seeds")),
        ([True, False, False], (False, "1 of 3 seeds")),
        ([True, False], (False, "1 of 2 seeds")),  # a tie is not most seeds
        ([True, True], (True, "2 of 2 seeds")),
        ([True, True, True, False, False], (True, "3 of 5 seeds")),
        ([True, True, False, False, False], (False, "2 of 5 seeds")),
    ],
)
def test_a_per_seed_statement_counts_when_true_on_more_than_half_the_seeds(oks, counts):
    assert seed_count(oks) == counts


def test_seed_count_needs_a_seed():
    with pytest.raises(ValueError):
        seed_count([])


def test_setups_that_disagree_make_the_claim_depend_on_its_setup():
    both = combine({"source": "holds", "learned": "holds"})
    assert both == ("holds", "holds in every setup (source, learned)")
    assert combine({"exact": "partly"}) == ("partly", "partly in its only setup")
    verdict, reason = combine({"source": "holds", "learned": "fails", "low-lr": "holds"})
    assert verdict == "depends"
    assert reason == "the verdict depends on the setup: holds in source, low-lr; fails in learned"
    with pytest.raises(ValueError):
        combine({})
    with pytest.raises(ValueError, match="'maybe' is not one of"):
        combine({"source": "maybe"})


def test_an_inconclusive_setup_never_makes_a_claim_depend():
    assert combine({"source": "holds", "tokens": "inconclusive"}) == (
        "holds", "holds in every conclusive setup (source) (tokens inconclusive, left out)",
    )  # fmt: skip
    verdict, reason = combine({"source": "holds", "x": "fails", "tokens": "inconclusive"})
    assert verdict == "depends" and reason.endswith("(tokens inconclusive, left out)")
    assert combine({"a": "inconclusive", "b": "inconclusive"})[0] == "inconclusive"


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
        Source("a", "b", "c", {"batch": "64"})


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
            assert specs and {s.train["seed"] for s in specs} == set(range(size["seeds"]))
            assert all(s.model["init"] == setup.init for s in specs)
