"""The init schemes (ModelConfig.init): each draws every linear layer of the blocks from its stated
distribution, checked on the built model against the published formula; the rest of the model draws
the same numbers in every scheme; DeepNorm's own init is not silently replaced."""

import math

import pytest
import torch
from torch import nn

from blocklab import Transformer
from blocklab.nn.config import from_saved_dict
from blocklab.nn.init_schemes import INIT_SCHEMES
from blocklab.nn.presets import preset

# the std each scheme's formula gives a weight of shape (fan_out, fan_in)
FORMULA = {
    "default": lambda fan_out, fan_in: 0.02,
    "torch": lambda fan_out, fan_in: math.sqrt(1 / (3 * fan_in)),  # PyTorch's nn.Linear (kaiming-uniform)
    "xavier": lambda fan_out, fan_in: math.sqrt(2 / (fan_in + fan_out)),  # Glorot and Bengio 2010
    "he": lambda fan_out, fan_in: math.sqrt(2 / fan_in),  # He et al. 2015
    "lecun": lambda fan_out, fan_in: math.sqrt(1 / fan_in),  # LeCun et al. 1998
}


def _built(init: str, **fields) -> Transformer:
    torch.manual_seed(0)
    return Transformer(preset("listops-seed", init=init, **fields))


def test_every_scheme_has_its_formula_here():
    assert set(FORMULA) == set(INIT_SCHEMES)


@pytest.mark.parametrize("init", list(INIT_SCHEMES))
@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_every_block_linear_is_drawn_from_the_schemes_distribution(init, activation):
    model = _built(init, activation=activation, n_layers=3)
    linears = [m for m in model.blocks.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 3 * (4 + (3 if activation == "swiglu" else 2))
    for linear in linears:
        w = linear.weight.detach().double()
        expected = FORMULA[init](*w.shape)
        tolerance = 4 / math.sqrt(2 * w.numel())  # four standard errors of a sample std
        assert abs(w.std().item() / expected - 1) < tolerance, (init, tuple(w.shape), w.std().item())
        assert abs(w.mean().item()) < 4 * expected / math.sqrt(w.numel())
        assert linear.bias is None or torch.equal(linear.bias, torch.zeros_like(linear.bias))


@pytest.mark.parametrize("init", [s for s in INIT_SCHEMES if s != "default"])
def test_outside_the_blocks_every_scheme_draws_the_same_numbers(init):
    default, other = _built("default").state_dict(), _built(init).state_dict()
    outside = [k for k in default if not k.startswith("blocks.")]
    assert "head.weight" in outside and "embed.weight" in outside
    assert all(torch.equal(default[k], other[k]) for k in outside)
    assert not torch.equal(default["blocks.0.ffn.w1.weight"], other["blocks.0.ffn.w1.weight"])


def test_deepnorm_refuses_an_init_it_would_overwrite():
    refused = "ModelConfig.init='xavier' would be overwritten: residual='deepnorm'"
    with pytest.raises(ValueError, match=refused):
        preset("listops-seed", residual="deepnorm", init="xavier")


def test_an_unknown_scheme_is_refused_by_name():
    refused = "ModelConfig.init='glorot' is not one of: default, xavier, he, lecun"
    with pytest.raises(ValueError, match=refused):
        preset("listops-seed", init="glorot")


def test_a_config_saved_before_the_field_loads_as_the_default_init():
    old = preset("listops-seed").to_dict()
    old.pop("init")
    assert from_saved_dict(old).init == "default"
