"""Every FFN kind as data (docs/concepts.md#feed-forward-network): the one table that names an FFN kind.

An FFN kind is the network around the activation; each activation's record (activation_kinds.py) names
the kind it runs in. For x (B, T, d) and W1, W3: (d_ff, d), W2: (d, d_ff):

    dense   FFN(x) = act(x W1^T + b1) W2^T + b2
    gated   FFN(x) = (gate(x W1^T + b1) * (x W3^T + b3)) W2^T + b2      (GLU: SwiGLU, GEGLU)

Everything that depends on the kind reads this table: FeedForward (which matrices it builds, its stages
and hook points), its lean kernel (kernels.act_kernel: act(h), or gate(h1) * h3), the parameter, memory
and FLOP counts, the CLI's formula column, TransformerLens' ``gated_mlp``, and the tracer's sentences
and formula kind. A new kind (a mixture of experts) is one entry here plus the module that computes it.

Torch-free: config imports it through activation_kinds.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FFNKind:
    """One FFN kind and everything its consumers ask of it."""

    name: str  # what an ActivationKind's ``ffn`` names
    label: str  # its name in words
    formula: str  # FFN(x) in words, as the module docstring writes it
    # the linear layers reading d_model, each d_ff wide: w1, and w3 when the activation of w1 x is a gate
    # multiplying a linear branch (their outputs are the FFN's h: (h,) or (h1, h3))
    in_matrices: tuple[str, ...]
    stages: tuple[str, ...]  # the FFN's hook points in forward order (its stages' last names)
    hidden_words: str = ""  # the tracer's words on ``hidden`` after W1's formula (the gate's role)
    operands: str = "act"  # the tracer's formula kind for ``act``: act(hidden), or gate(hidden) * linear

    @property
    def gated(self) -> bool:
        """Whether W1's activation gates a linear branch W3 (TransformerLens' ``gated_mlp``)."""
        return len(self.in_matrices) > 1

    @property
    def input_matrices(self) -> int:
        """The width rule: matrices reading d_model, each d_ff wide."""
        return len(self.in_matrices)

    def parameters(self, d_model: int, d_ff: int, bias: bool) -> int:
        """The input matrices (d d_ff each, + d_ff bias) and W2 (d_ff d, + d bias)."""
        return self.input_matrices * (d_model * d_ff + (d_ff if bias else 0)) + d_ff * d_model + \
            (d_model if bias else 0)

    def matmuls(self, d_model: int, d_ff: int) -> int:
        """Multiply-adds per token of the FFN's matrices: (inputs + W2) d d_ff."""
        return (self.input_matrices + 1) * d_model * d_ff


FFN_KINDS: dict[str, FFNKind] = {
    kind.name: kind for kind in (
        FFNKind("dense", "dense FFN", "act(x W1^T + b1) W2^T + b2", ("w1",), ("hidden", "act", "out")),
        FFNKind("gated", "gated FFN (GLU)", "(gate(x W1^T + b1) * (x W3^T + b3)) W2^T + b2", ("w1", "w3"),
                ("hidden", "linear", "act", "out"), operands="gated",
                hidden_words=" (the gate branch; W3 x is the linear branch)"),
    )
}
