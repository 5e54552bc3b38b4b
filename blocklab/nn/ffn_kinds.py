"""Every FFN kind as data (docs/concepts.md#feed-forward-network): the one table that names an FFN kind.

An FFN kind is the network around the activation; each activation's record (activation_kinds.py) names
the kind it runs in. For x (B, T, d) and W1, W3: (d_ff, d), W2: (d, d_ff):

    dense   FFN(x) = act(x W1^T + b1) W2^T + b2
    gated   FFN(x) = (gate(x W1^T + b1) * (x W3^T + b3)) W2^T + b2      (GLU: SwiGLU, GEGLU)

Everything that depends on the kind reads this table: FeedForward (which matrices it builds, its stages
and hook points), its lean kernel (kernels.act_kernel: act(h), or gate(h1) * h3), the parameter, memory
and FLOP counts, the CLI's formula column, TransformerLens' ``gated_mlp``, and the tracer's sentences
and formula kind. A new kind is one entry here plus the module that computes it.

A mixture of experts (moe.py) is E FFNs of one kind ("experts") behind a router: logits r = x Wr^T (E per
token), each token's k experts and their weights chosen as one of ``ROUTINGS`` says, and

    MoE(x) = sum over its k experts e of  w_e FFN_e(x)
             (+ sigmoid(x Wg^T) FFN_shared(x) with a shared expert)

``moe_violations`` holds its config rules, ``moe_parameters`` its counts (total and active per token);
``resolve_d_ff`` the FFN's width from an integer or a ratio times d_model.

Torch-free: config imports it through activation_kinds.py.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class Routing:
    """How a mixture of experts turns a token's router logits r (E) into its k experts and their weights."""

    name: str  # the ModelConfig.router_softmax value
    label: str
    formula: str  # the weights in words
    renormalises: bool  # whether its top-k weights sum to 1 by construction (renormalize_top_k can't apply)


ROUTINGS: dict[str, Routing] = {
    routing.name: routing for routing in (
        # Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE: p = softmax(r) over all E, the k largest kept (their sum < 1
        # unless renormalised: Mixtral always, Qwen2-MoE never, Qwen3-MoE and OLMoE by norm_topk_prob)
        Routing("before_top_k", "softmax, then top-k", "w = top-k of softmax(r) (divided by their sum when "
                "renormalize_top_k)", renormalises=False),
        # Switch-style routers written as softmax over the k largest logits (Mistral's reference MoE)
        Routing("after_top_k", "top-k, then softmax", "w = softmax of the k largest r", renormalises=True),
    )
}

# The mixture-of-experts fields and their values for one dense FFN (no experts): the only values they may
# take with n_experts=0. Defaults follow Mixtral (top-2, renormalised) and Switch's aux coefficient 0.01.
MOE_FIELDS: dict[str, object] = {"experts_per_token": 2, "router_softmax": "before_top_k",
                                 "renormalize_top_k": True, "shared_expert_d_ff": 0,
                                 "router_aux_loss_coef": 0.01}


def moe_violations(n_experts: object, values: dict[str, object]) -> list[str]:
    """The rules of the mixture-of-experts fields (``values``: MOE_FIELDS' names -> the config's values),
    as messages naming field, value and rule (without the ``ModelConfig.`` prefix)."""
    if not (isinstance(n_experts, int) and not isinstance(n_experts, bool) and n_experts >= 0):
        return [f"n_experts={n_experts!r} must be an integer >= 0 (0: one dense FFN, no experts)"]
    if n_experts == 0:
        return [f"{name}={value!r} applies to a mixture of experts, but n_experts=0 (one dense FFN): "
                "leave it unset or set n_experts"
                for name, value in values.items() if value != MOE_FIELDS[name]]
    errors = []
    k, routing = values["experts_per_token"], values["router_softmax"]
    if not (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= n_experts):
        errors.append(f"experts_per_token={k!r} must be an integer in [1, n_experts={n_experts}]")
    if not isinstance(values["renormalize_top_k"], bool):
        errors.append(f"renormalize_top_k={values['renormalize_top_k']!r} must be true or false")
    elif routing in ROUTINGS and ROUTINGS[routing].renormalises and not values["renormalize_top_k"]:
        errors.append(f"renormalize_top_k=False cannot apply: router_softmax={routing!r} gives weights that "
                      "sum to 1 by construction")
    shared = values["shared_expert_d_ff"]
    if not (isinstance(shared, int) and not isinstance(shared, bool) and shared >= 0):
        errors.append(f"shared_expert_d_ff={shared!r} must be an integer >= 0 (0: no shared expert)")
    coef = values["router_aux_loss_coef"]
    if not (isinstance(coef, (int, float)) and not isinstance(coef, bool) and 0 <= coef < float("inf")):
        errors.append(f"router_aux_loss_coef={coef!r} must be a finite number >= 0")
    return errors


def moe_parameters(kind: FFNKind, d_model: int, d_ff: int, bias: bool, n_experts: int, shared_d_ff: int
                   ) -> dict[str, int]:
    """A mixture's parameters by part: ``router`` (E d, no bias), ``experts`` (E FFNs of d_ff), and with a
    shared expert ``shared_expert`` (its FFN and its gate's d weights)."""
    counts = {"router": n_experts * d_model, "experts": n_experts * kind.parameters(d_model, d_ff, bias)}
    if shared_d_ff:
        counts["shared_expert"] = kind.parameters(d_model, shared_d_ff, bias) + d_model
    return counts


def resolve_d_ff(d_ff: int | float | str, d_model: int) -> int:
    """d_ff as an integer, or a ratio times d_model: ``4.0``, ``"4x"``, ``"8/3x"``.

    Rounding rule for ratios: round(ratio * d_model) to the nearest integer (half up).
    ``"8/3x"`` with d_model 384 gives 1024.
    """
    if isinstance(d_ff, bool):
        raise ValueError(f"ModelConfig.d_ff={d_ff!r} must be an integer >= 1 or a ratio like 4.0 or '8/3x'")
    if isinstance(d_ff, int):
        return d_ff
    ratio: float
    if isinstance(d_ff, str):
        text = d_ff.strip().removesuffix("x")
        try:
            num, _, den = text.partition("/")
            ratio = float(num) / float(den) if den else float(num)
        except (ValueError, ZeroDivisionError):
            raise ValueError(
                f"ModelConfig.d_ff={d_ff!r} must be an integer >= 1 or a ratio like 4.0 or '8/3x'"
            ) from None
        if not den and "." not in num and not d_ff.strip().endswith("x") and ratio.is_integer():
            return int(ratio)  # "256" is an integer, "4x" a ratio
    elif isinstance(d_ff, float):
        ratio = d_ff
    else:
        raise ValueError(f"ModelConfig.d_ff={d_ff!r} must be an integer >= 1 or a ratio like 4.0 or '8/3x'")
    if not (ratio > 0 and math.isfinite(ratio * d_model)):
        raise ValueError(f"ModelConfig.d_ff ratio {d_ff!r} must be a finite number > 0")
    return int(ratio * d_model + 0.5)
