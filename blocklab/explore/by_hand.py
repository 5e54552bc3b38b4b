"""The page's "by hand" panel: a vector the learner types, through a norm, an activation or the served
model's FFN, step by step: ``blocklab explain``'s steps (inspect/trace/by_hand.py), as JSON.

    POST /api/explain  {model, input, what: "norm" | "activation" | "ffn", vector: [numbers], norm?,
                        gamma?, beta? (what "norm"), activation? (what "activation"), block? (what "ffn")}

A norm is the norm kind named (the served model's by default) with the model's eps, gamma ones and beta
zeros unless given; an activation the kind named (the model's by default); the FFN the served model's
block ``block`` (0 by default) with its weights, run in float64.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..inspect.trace.by_hand import activations_by_hand, ffn_by_hand, norm_by_hand
from ..inspect.trace.walk import WalkStep, step_to_dict
from .session import Request, RequestError

WHAT = ("norm", "activation", "ffn")
MAX_VECTOR = 4096  # numbers in a typed vector (the widest d_model of the presets)


def _vector(value: Any, name: str) -> Tensor:
    """A list of 1 to ``MAX_VECTOR`` finite numbers, as float64; RequestError naming ``name`` otherwise."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_VECTOR or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        raise RequestError(f"{name} must be a list of 1 to {MAX_VECTOR} finite numbers")
    return torch.tensor(value, dtype=torch.float64)


def _name(body: dict[str, Any], key: str, default: str) -> str:
    value = body.get(key) or default
    if not isinstance(value, str):
        raise RequestError(f"{key} must be a name, as text")
    return value


def _ffn_steps(request: Request, x: Tensor, block: Any) -> list[WalkStep]:
    """The served model's FFN of block ``block`` on ``x`` (under the model's lock: no ablation attached)."""
    model = request.entry.subject.model
    n = len(model.blocks)
    if not (isinstance(block, int) and not isinstance(block, bool) and 0 <= block < n):
        raise RequestError(f"block {block!r:.40} must be a block of the model: 0 to {n - 1}")
    if model.config.n_experts:
        raise RequestError(f"block {block}'s FFN is a mixture of {model.config.n_experts} experts; the "
                           "by-hand FFN is one dense FFN (the trace shows each expert's numbers)")
    with request.entry.lock:
        return ffn_by_hand(x, model.blocks[block].ffn, f"block {block}: " if n > 1 else "")


def explain(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    """The steps of the explanation ``body`` asks for: {"what", "subject", "steps": [step_to_dict]}."""
    what = body.get("what")
    if what not in WHAT:
        raise RequestError(f"what {what!r:.40} must be one of: {', '.join(WHAT)}")
    x = _vector(body.get("vector"), "vector")
    c = request.entry.subject.model.config
    try:
        if what == "norm":
            gamma, beta = (None if body.get(k) is None else _vector(body[k], k) for k in ("gamma", "beta"))
            norm = _name(body, "norm", c.norm)
            steps, subject = norm_by_hand(x, norm, c.eps, gamma, beta), f"norm {norm}, eps {c.eps:g}"
        elif what == "activation":
            name = _name(body, "activation", c.activation)
            steps, subject = activations_by_hand(x, [name]), f"activation {name}"
        else:
            block = body.get("block", 0)
            steps, subject = _ffn_steps(request, x, block), f"block {block}'s FFN"
    except ValueError as error:  # a vector of the wrong length, an unknown kind: the learner's to fix
        raise RequestError(str(error)) from None
    return {"what": what, "subject": subject, "steps": [step_to_dict(s) for s in steps]}
