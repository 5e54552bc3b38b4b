"""Tests for blocklab.cli.explore: which models the flags name (the server itself: tests/explore)."""

from __future__ import annotations

import pytest
import torch

import blocklab as bl
from blocklab.cli import build_parser
from blocklab.cli.explore import models_for_args
from blocklab.errors import UsageError


def served(*flags: str) -> dict:
    return models_for_args(build_parser().parse_args(["explore", *flags]))


def test_vary_serves_each_variant_of_the_preset_with_the_same_seed() -> None:
    models = served("--preset", "listops-seed", "--seed", "3", "--vary", "norm_position=post,pre,sandwich",
                    "--d-ff", "128")
    assert list(models) == ["listops-seed", "listops-seed norm_position=pre",
                            "listops-seed norm_position=sandwich"]
    tokens = torch.tensor([[11, 15, 2, 17]])
    for name, fields in (("listops-seed", {}),
                         ("listops-seed norm_position=sandwich", {"norm_position": "sandwich"})):
        torch.manual_seed(3)
        oracle = bl.Transformer(bl.preset("listops-seed", d_ff=128, **fields)).eval()
        with torch.no_grad():
            assert torch.equal(models[name].subject.model(tokens), oracle(tokens))
    assert models["listops-seed norm_position=pre"].subject.model.config.norm_position == "pre"


@pytest.mark.parametrize(("vary", "field", "values"), [("residual=add,none", "residual", ["add", "none"]),
                                                     ("norm=standard,none", "norm", ["standard", "none"])])
def test_vary_serves_the_none_ablations_beside_the_preset(vary: str, field: str, values: list[str]) -> None:
    """The docs' with-and-without-the-residual comparison: both values served, not add twice."""
    models = served("--preset", "listops-seed", "--vary", vary)
    assert [m.subject.model.config.__getattribute__(field) for m in models.values()] == values


def test_no_flag_serves_listops_seed_and_names_stay_unique() -> None:
    assert list(served()) == ["listops-seed"]
    assert list(served("--preset", "tiny-lm", "--preset", "tiny-lm")) == ["tiny-lm", "tiny-lm (2)"]


@pytest.mark.parametrize("flags, message", [
    (["--vary", "lr=1e-3,1e-2"], "explore varies ModelConfig fields only"),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--vary", "norm_position=pre,bogus"], "norm_position"),
])
def test_bad_model_flags_are_refused_before_serving(flags: list[str], message: str) -> None:
    with pytest.raises((ValueError, UsageError), match=message):
        served(*flags)


def test_the_models_are_summed_against_the_memory_before_any_is_built() -> None:
    """Issue 35, F6: each model was checked against the available memory on its own, so a grid of models
    that each fit was built one after another until the machine ran out. Here six variants each need
    between a quarter and a half of what is available (each passes the check alone; the preset as built
    is one of them, post-norm with tied embeddings): refused before building, naming the total."""
    from blocklab.inspect.trace.subject import preset_config
    from blocklab.nn.memory import InsufficientMemoryError, available_memory, estimate_memory

    found = available_memory()
    if found is None:
        pytest.skip("this machine does not say how much memory is available")
    available = found[0]
    need = lambda d: estimate_memory(preset_config("listops-seed", {"d_model": d, "d_ff": 4 * d}), 1,
                                     training=False).total
    d = 64
    while need(d) < available / 4:
        d *= 2
    assert need(d) < available / 2 < 6 * need(d)  # each fits alone; the six do not
    with pytest.raises(InsufficientMemoryError, match=r"explore's 6 preset models need about .* in total"):
        served("--d-model", str(d), "--d-ff", str(4 * d), "--vary", "norm_position=pre,post,sandwich",
               "--vary", "tie_embeddings=true,false")
