"""Activations against their formulas (docs/concepts.md#feed-forward-network) and the worked
approximation errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from blocklab.nn.activations import ACTIVATION_NAMES, get_activation


def exact_gelu_scalar(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_gelu_is_exact_erf_form() -> None:
    xs = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    expected = torch.tensor([exact_gelu_scalar(float(x)) for x in xs], dtype=torch.float64)
    torch.testing.assert_close(get_activation("gelu")(xs), expected, rtol=0, atol=1e-12)


def test_gelu_tanh_matches_formula_and_torch() -> None:
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    formula = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(get_activation("gelu_tanh")(x), formula, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        get_activation("gelu_tanh")(x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-12
    )


def test_gelu_sigmoid_and_relu2_match_formulas() -> None:
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    torch.testing.assert_close(
        get_activation("gelu_sigmoid")(x), x / (1 + torch.exp(-1.702 * x)), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(get_activation("relu2")(x), torch.clamp(x, min=0) ** 2, rtol=0, atol=0)
    torch.testing.assert_close(get_activation("relu")(x), torch.where(x > 0, x, 0.0), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("name", "max_err", "where"), [("gelu_tanh", 4.73e-4, 2.70), ("gelu_sigmoid", 2.03e-2, 2.27)]
)
def test_gelu_approximation_errors_match_spec(name, max_err, where) -> None:
    x = torch.linspace(-10, 10, 2_000_001, dtype=torch.float64)
    err = (get_activation(name)(x) - F.gelu(x)).abs()
    assert float(f"{err.max().item():.3g}") == max_err  # docs/concepts.md gives three significant digits
    # the error is even in x (approx(-x) = approx(x) - x, as for the exact GELU): peaks at +-where
    assert abs(x[err.argmax()].abs().item() - where) < 0.005


def test_unknown_activation_lists_names() -> None:
    with pytest.raises(ValueError) as info:
        get_activation("swish")
    for name in ACTIVATION_NAMES:
        assert name in str(info.value)
