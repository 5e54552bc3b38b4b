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
