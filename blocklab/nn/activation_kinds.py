"""Every activation as data (docs/concepts.md#feed-forward-network): the one table that names an activation.

Each ``ActivationKind`` holds everything a consumer asks of it: its function and its derivative (ATen's
own backward kernel where autograd has one, else written out), the FFN kind it runs in (ffn_kinds.py:
dense, or gated, where ``function(w1 x)`` is the gate multiplying the linear branch ``w3 x``), its label,
the tracer's sentence and TransformerLens' name for it. The FFN module and its lean kernel
(kernels.act_kernel), the parameter and memory counts, the config's choices, the CLI's formula column and
the tracer read this table; a new activation is one entry (and, when torch has no such function, the
function in activations.py).

Torch-free, as norm_kinds.py: the torch functions are named here (``function``, ``backward``: names in
activations.py) and looked up there; a record made where torch is at hand (a test's) may hold the
functions themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ffn_kinds import FFN_KINDS, FFNKind

# act(h) over a Tensor, or the name of such a function in activations.py
Function = Callable[[Any], Any] | str
# backward(g, saved) -> dL/dh given g = dL/da, written over g (a temporary of the backward pass: one
# (N, d_ff) tensor less where a block's backward peaks); ``saved`` is h, or a when ``saves_output``;
# or the name of such a function in activations.py
Backward = Callable[[Any, Any], Any] | str


@dataclass(frozen=True)
class ActivationKind:
    """One ``ModelConfig.activation`` value and everything its consumers ask of it."""

    name: str  # the ModelConfig.activation value
    label: str  # its name in words
    explains: str  # the tracer's sentence on the ffn.act stage (the formula in words)
    function: Function  # act(h); gated: the gate function of gate(h1) * h3
    backward: Backward  # dL/dh of ``function``, over g (ATen's kernel where autograd uses one)
    saves_output: bool = False  # backward needs a = act(h), not h (ReLU: a > 0 exactly where h > 0)
    ffn: str = "dense"  # the FFN kind it runs in (ffn_kinds.FFN_KINDS)
    # TransformerLens' act_fn (the gate's, with gated_mlp); None: TransformerLens has none like it
    transformerlens: str | None = None

    @property
    def ffn_kind(self) -> FFNKind:
        """The record of the FFN kind this activation runs in."""
        return FFN_KINDS[self.ffn]

    @property
    def gated(self) -> bool:
        """Whether it gates a linear branch (its FFN kind's ``gated``)."""
        return self.ffn_kind.gated

    @property
    def input_matrices(self) -> int:
        """Its FFN kind's width rule: matrices reading d_model, each d_ff wide."""
        return self.ffn_kind.input_matrices


ACTIVATION_KINDS: dict[str, ActivationKind] = {
    kind.name: kind for kind in (
        ActivationKind("relu", "ReLU", "ReLU max(0, h) set the negative units to 0", "relu", "relu_backward",
                       saves_output=True, transformerlens="relu"),
        ActivationKind(
            "gelu", "GELU",
            "GELU h * Phi(h) (exact, erf) kept positives and squashed negatives toward 0 (never below -0.17)",
            "gelu", "gelu_backward", transformerlens="gelu",
        ),
        ActivationKind(
            "gelu_tanh", "GELU (tanh)", "GELU (tanh approximation) kept positives and squashed negatives "
            "toward 0", "gelu_tanh", "gelu_tanh_backward", transformerlens="gelu_new",
        ),
        ActivationKind(
            "gelu_sigmoid", "GELU (sigmoid)", "GELU (sigmoid approximation h * sigmoid(1.702 h)) kept "
            "positives, squashed negatives", "gelu_sigmoid", "gelu_sigmoid_backward",
        ),
        ActivationKind("relu2", "squared ReLU", "squared ReLU max(0, h)^2 zeroed the negatives and squared "
                       "the rest", "relu2", "relu2_backward"),
        ActivationKind("swiglu", "SwiGLU", "SwiGLU: silu(W1 x) * (W3 x), the gate times the linear branch",
                       "silu", "silu_backward", ffn="gated", transformerlens="silu"),
        ActivationKind("geglu", "GEGLU", "GEGLU: gelu(W1 x) * (W3 x), the gate times the linear branch",
                       "gelu", "gelu_backward", ffn="gated", transformerlens="gelu"),
        ActivationKind("geglu_tanh", "GEGLU (tanh)", "GEGLU with GELU's tanh approximation: "
                       "gelu_tanh(W1 x) * (W3 x), the gate times the linear branch (Gemma)", "gelu_tanh",
                       "gelu_tanh_backward", ffn="gated", transformerlens="gelu_pytorch_tanh"),
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
