"""The FFN's nonlinearities in torch: each function an activation's record (activation_kinds.py) names,
its derivative, and the lookup from a record to the pair (``implementation``).

The records themselves are torch-free and live in activation_kinds.py; their names are importable from
here too (``ACTIVATION_KINDS``, ``ActivationKind``, ``ACTIVATION_NAMES``, ``activation_kind``, ``is_gated``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .activation_kinds import ACTIVATION_KINDS, ACTIVATION_NAMES, ActivationKind, activation_kind, is_gated

__all__ = ["ACTIVATION_KINDS", "ACTIVATION_NAMES", "ActivationKind", "activation_kind", "get_activation",
           "implementation", "is_gated"]

Activation = Callable[[Tensor], Tensor]
# backward(g, saved) -> dL/dh given g = dL/da, written over g; ``saved`` is h, or a when ``saves_output``
Backward = Callable[[Tensor, Tensor], Tensor]


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


_aten = torch.ops.aten


def relu_backward(g: Tensor, a: Tensor) -> Tensor:
    """g * (a > 0), from the output a (ATen's kernel)."""
    return _aten.threshold_backward.grad_input(g, a, 0, grad_input=g)


def gelu_backward(g: Tensor, h: Tensor) -> Tensor:
    """g (Phi(h) + h phi(h)) (ATen's kernel)."""
    return _aten.gelu_backward.grad_input(g, h, grad_input=g)


def gelu_tanh_backward(g: Tensor, h: Tensor) -> Tensor:
    """The tanh approximation's derivative (ATen's kernel)."""
    return _aten.gelu_backward.grad_input(g, h, approximate="tanh", grad_input=g)


def gelu_sigmoid_backward(g: Tensor, h: Tensor) -> Tensor:
    """d/dh h s(c h) = s + c h s (1 - s), s = sigmoid(c h)."""
    s = torch.sigmoid(GELU_SIGMOID_SCALE * h)
    return g.mul_(s + GELU_SIGMOID_SCALE * h * s * (1 - s))


def relu2_backward(g: Tensor, h: Tensor) -> Tensor:
    """d/dh relu(h)^2 = 2 relu(h)."""
    return g.mul_(F.relu(h)).mul_(2)


def silu_backward(g: Tensor, h: Tensor) -> Tensor:
    """s (1 + h (1 - s)), s = sigmoid(h) (ATen's kernel)."""
    return _aten.silu_backward.grad_input(g, h, grad_input=g)


def _resolved(ref: Callable | str, kind: ActivationKind, field: str) -> Callable:
    if callable(ref):
        return ref
    found = globals().get(ref)
    if not callable(found):
        raise ValueError(f"activation {kind.name!r}: its {field} {ref!r} is no function in {__name__}")
    return found


def implementation(kind: ActivationKind) -> tuple[Activation, Backward]:
    """(act, its backward) of a record: the functions it holds, or those it names in this module."""
    return _resolved(kind.function, kind, "function"), _resolved(kind.backward, kind, "backward")


def get_activation(name: str) -> Activation:
    """The function for an activation name (the gate function for gated variants)."""
    return implementation(activation_kind(name))[0]
