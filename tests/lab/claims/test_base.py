"""What a claim is made of: checks to verdicts, setups' verdicts to the claim's, validated setups."""

import dataclasses

import pytest

from blocklab.lab.claims import CLAIMS, Setup, Source, combine, from_checks
from blocklab.lab.claims import relu_sparsity as a_training_claim
from blocklab.lab.claims.shared import run_spec


def test_verdict_from_checks_and_its_reason():
    assert from_checks([("a", True), ("b", True)]).verdict == "holds"
    assert from_checks([("a", False)]).verdict == "fails"
    v = from_checks([("a is 1", True), ("b is 2", False)])
    assert v.verdict == "partly" and v.reason == "true: a is 1; not true: b is 2"
    assert v.checks == [{"check": "a is 1", "ok": True}, {"check": "b is 2", "ok": False}]
    with pytest.raises(ValueError):
        from_checks([])


def test_setups_that_disagree_make_the_claim_depend_on_its_setup():
    both = combine({"source": "holds", "learned": "holds"})
    assert both == ("holds", "holds in every setup (source, learned)")
    assert combine({"exact": "partly"}) == ("partly", "partly in its only setup")
    verdict, reason = combine({"source": "holds", "learned": "fails", "low-lr": "holds"})
    assert verdict == "depends"
    assert reason == "the verdict depends on the setup: holds in source, low-lr; fails in learned"
    with pytest.raises(ValueError):
        combine({})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"role": "main"}, "role='main' is not one of"),
        ({"model": {"d_modle": 8}}, "'d_modle' is not a ModelConfig field"),
        ({"train": {"lrr": 1.0}}, "'lrr' is not a TrainConfig field"),
        ({"train": {"seed": 1}}, "seeds are the claim's sizes"),
        ({"init": "kaiming"}, "init='kaiming' is not one of: default, xavier"),
    ],
)
def test_a_setup_refuses_what_cannot_apply(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Setup(**{"name": "s", "role": "source", "why": "because it is", **kwargs})


def test_a_confound_is_its_source_but_for_what_it_names():
    source = Setup("paper", "source", "the paper's", train={"lr": 1e-3})
    confound = source.but("learned", "learned positions", model={"pos_encoding": "learned"})
    assert (confound.role, confound.model, confound.train, confound.init) == (
        "confound", {"pos_encoding": "learned"}, {"lr": 1e-3}, "default",
    )  # fmt: skip


def test_a_claim_refuses_setups_that_cannot_apply():
    claim = a_training_claim.CLAIM
    source = claim.setups[0]
    with pytest.raises(ValueError, match="one 'source' setup and at least one 'confound'"):
        dataclasses.replace(claim, setups=(source,))
    with pytest.raises(ValueError, match="init must be 'default'"):
        dataclasses.replace(claim, setups=(source, source.but("x", "xavier weights", init="xavier")))
    with pytest.raises(ValueError, match="distinct names"):
        dataclasses.replace(claim, setups=(source, source.but(source.name, "same name")))
    with pytest.raises(ValueError, match="training claims, and only they, have runs"):
        dataclasses.replace(claim, runs=None)
    with pytest.raises(ValueError, match="Source.setup key 'batch'"):
        Source("a", "b", "c", {"batch": "64"})


def test_a_run_is_the_claims_sizes_then_the_setup_then_the_run():
    setup = Setup("s", "source", "a setup", model={"pos_encoding": "learned"}, train={"lr": 1e-3})
    sizes = {"d_model": 32, "steps": 200, "lr": 1e-2, "warmup": 500, "batch_size": 64}
    spec = run_spec("claim", setup, "x/L2", sizes, {"n_layers": 2}, batch_size=8)
    assert spec.key == "claim/s/x/L2" and spec.task == {"name": "listops"}
    assert spec.model == {"d_model": 32, "d_ff": 128, "n_heads": 4, "pos_encoding": "learned", "n_layers": 2}
    assert (spec.train["lr"], spec.train["batch_size"], spec.train["steps"]) == (1e-3, 8, 200)
    assert spec.train["warmup"] == 200  # never longer than the run
    with pytest.raises(ValueError, match="sets TrainConfig field 'lr', which the claim itself varies"):
        run_spec("claim", setup, "x", sizes, lr=1e-2)
    with pytest.raises(ValueError, match="sets ModelConfig field 'pos_encoding'"):
        run_spec("claim", setup, "x", sizes, {"pos_encoding": "sinusoidal"})


@pytest.mark.parametrize("claim", [c for c in CLAIMS if c.runs], ids=lambda c: c.name)
def test_no_setup_sets_what_its_claim_varies(claim):
    for setup in claim.setups:  # run_spec raises on a field both set
        for size in (claim.quick, claim.full):
            assert claim.runs(size, setup)
