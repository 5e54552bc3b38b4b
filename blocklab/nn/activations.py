"""The FFN's nonlinearities as records (docs/concepts.md#feed-forward-network): the one table that names
an activation.

Each ``ActivationKind`` holds everything a consumer asks of it: its function, its derivative (ATen's own
backward kernel where autograd has one, else written out), whether it is gated (a gated FFN multiplies
``function(w1 x)``, the gate, by the linear branch ``w3 x``: a third matrix, so two of them read d_model),
its label and the tracer's sentence. The FFN module and its lean kernel (kernels.act_kernel), the
parameter and memory counts, the config's choices, the CLI's formula column and the tracer read this
table; a new activation is one entry.

The records hold torch functions, so unlike norm_kinds.py this table imports torch (config does too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

Activation = Callable[[Tensor], Tensor]
# backward(g, saved) -> dL/dh given g = dL/da, written over g (a temporary of the backward pass: one
# (N, d_ff) tensor less where a block's backward peaks); ``saved`` is h, or a when ``saves_output``
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


def _gelu_sigmoid_backward(g: Tensor, h: Tensor) -> Tensor:
    s = torch.sigmoid(GELU_SIGMOID_SCALE * h)  # d/dh h s(c h) = s + c h s (1 - s)
    return g.mul_(s + GELU_SIGMOID_SCALE * h * s * (1 - s))


@dataclass(frozen=True)
class ActivationKind:
    """One ``ModelConfig.activation`` value and everything its consumers ask of it."""

    name: str  # the ModelConfig.activation value
    label: str  # its name in words
    explains: str  # the tracer's sentence on the ffn.act stage (the formula in words)
    function: Activation  # act(h); gated: the gate function of gate(h1) * h3
    backward: Backward  # dL/dh of ``function``, over g (ATen's kernel where autograd uses one)
    saves_output: bool = False  # backward needs a = act(h), not h (ReLU: a > 0 exactly where h > 0)
    gated: bool = False  # gate(w1 x) * (w3 x): a third matrix
    # TransformerLens' act_fn (the gate's, with gated_mlp); None: TransformerLens has none like it
    transformerlens: str | None = None

    @property
    def input_matrices(self) -> int:
        """The width rule: matrices reading d_model, each d_ff wide (w1, and w3 when gated)."""
        return 2 if self.gated else 1


ACTIVATION_KINDS: dict[str, ActivationKind] = {
    kind.name: kind for kind in (
        ActivationKind(
            "relu", "ReLU", "ReLU max(0, h) set the negative units to 0", relu,
            lambda g, a: _aten.threshold_backward.grad_input(g, a, 0, grad_input=g),  # g * (a > 0)
            saves_output=True, transformerlens="relu",
        ),
        ActivationKind(
            "gelu", "GELU",
            "GELU h * Phi(h) (exact, erf) kept positives and squashed negatives toward 0 (never below -0.17)",
            gelu, lambda g, h: _aten.gelu_backward.grad_input(g, h, grad_input=g),  # g (Phi(h) + h phi(h))
            transformerlens="gelu",
        ),
        ActivationKind(
            "gelu_tanh", "GELU (tanh)", "GELU (tanh approximation) kept positives and squashed negatives "
            "toward 0", gelu_tanh,
            lambda g, h: _aten.gelu_backward.grad_input(g, h, approximate="tanh", grad_input=g),
            transformerlens="gelu_new",
        ),
        ActivationKind(
            "gelu_sigmoid", "GELU (sigmoid)", "GELU (sigmoid approximation h * sigmoid(1.702 h)) kept "
            "positives, squashed negatives", gelu_sigmoid, _gelu_sigmoid_backward,
        ),
        ActivationKind(
            "relu2", "squared ReLU", "squared ReLU max(0, h)^2 zeroed the negatives and squared the rest",
            relu2, lambda g, h: g.mul_(F.relu(h)).mul_(2),  # d/dh relu(h)^2 = 2 relu(h)
        ),
        ActivationKind(
            "swiglu", "SwiGLU", "SwiGLU: silu(W1 x) * (W3 x), the gate times the linear branch", silu,
            lambda g, h: _aten.silu_backward.grad_input(g, h, grad_input=g),  # s (1 + h (1 - s))
            gated=True, transformerlens="silu",
        ),
        ActivationKind(
            "geglu", "GEGLU", "GEGLU: gelu(W1 x) * (W3 x), the gate times the linear branch", gelu,
            lambda g, h: _aten.gelu_backward.grad_input(g, h, grad_input=g),  # gate: exact GELU
            gated=True, transformerlens="gelu",
        ),
    )
}

ACTIVATION_NAMES: tuple[str, ...] = tuple(ACTIVATION_KINDS)  # as the package ships them


def activation_kind(name: str) -> ActivationKind:
    """The record of an activation name; ValueError naming the known ones."""
    if name not in ACTIVATION_KINDS:
        raise ValueError(f"activation={name!r} is not one of: {', '.join(ACTIVATION_KINDS)}")
    return ACTIVATION_KINDS[name]


def is_gated(name: str) -> bool:
    """True for activations that need a third matrix (w3)."""
    kind = ACTIVATION_KINDS.get(name)
    return kind is not None and kind.gated


def get_activation(name: str) -> Activation:
    """The function for an activation name (the gate function for gated variants)."""
    return activation_kind(name).function
