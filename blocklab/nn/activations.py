"""The FFN's nonlinearities: ReLU, GELU (exact, tanh, sigmoid), ReLU^2, gated pairs
(docs/concepts.md#feed-forward-network).

Each activation is a plain function of a tensor. Gated variants (SwiGLU, GEGLU) name the
function applied to the gate branch ``w1 x``; the FFN multiplies it by the linear branch ``w3 x``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

Activation = Callable[[Tensor], Tensor]


def relu(x: Tensor) -> Tensor:
    """max(0, x)."""
    return F.relu(x)


def gelu(x: Tensor) -> Tensor:
    """Exact GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    return F.gelu(x)


def gelu_tanh(x: Tensor) -> Tensor:
    """Tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2)."""
    return F.gelu(x, approximate="tanh")


GELU_SIGMOID_SCALE = 1.702


def gelu_sigmoid(x: Tensor) -> Tensor:
    """Sigmoid approximation: x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(GELU_SIGMOID_SCALE * x)


def relu2(x: Tensor) -> Tensor:
    """Squared ReLU: max(0, x)^2 (Primer)."""
    return torch.square(F.relu(x))


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x), the gate function of SwiGLU."""
    return F.silu(x)


# Ungated activations: act(x W1^T + b1).
ACTIVATIONS: dict[str, Activation] = {
    "relu": relu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "gelu_sigmoid": gelu_sigmoid,
    "relu2": relu2,
}

# Gated activations: gate_fn(x W1^T + b1) * (x W3^T + b3).
GATED_ACTIVATIONS: dict[str, Activation] = {
    "swiglu": silu,
    "geglu": gelu,
}

ACTIVATION_NAMES: tuple[str, ...] = tuple(ACTIVATIONS) + tuple(GATED_ACTIVATIONS)


def is_gated(name: str) -> bool:
    """True for activations that need a third matrix (w3)."""
    return name in GATED_ACTIVATIONS


def get_activation(name: str) -> Activation:
    """The function for an activation name (the gate function for gated variants)."""
    table = {**ACTIVATIONS, **GATED_ACTIVATIONS}
    if name not in table:
        raise ValueError(f"activation={name!r} is not one of: {', '.join(ACTIVATION_NAMES)}")
    return table[name]

