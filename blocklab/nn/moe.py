"""The mixture-of-experts FFN (docs/concepts.md#feed-forward-network; Shazeer et al. 2017, Switch
Transformer, Mixtral): E expert FFNs behind a router, each token sent to k of them.

    r = x Wr^T                                     router logits, (B, T, E); Wr: (E, d), no bias
    w, e = ROUTINGS[router_softmax](r, k)          each token's k experts e and weights w, (B, T, k)
    MoE(x) = sum_j w_j FFN_{e_j}(x)                each expert an FFN of the activation's kind (dense, gated)
           (+ sigmoid(x Wg^T) FFN_shared(x))       a shared expert behind its gate (Qwen2-MoE), Wg: (1, d)

The routing is computed in float32 at least (as transformers does: a bfloat16 softmax would round the
weights to 3 digits), the weights cast back to x's dtype. The load-balancing loss of Switch Transformer
(eq. 4-6), in the form transformers' ``load_balancing_loss_func`` computes over all layers' tokens:

    aux = E * sum_{j,e} f_{j,e} P_e    f_{j,e}: share of tokens whose j-th choice is e; P_e: mean softmax(r)_e

Stages (hook points, in forward order): ``router_logits`` (B, T, E), ``expert_indices`` (B, T, k) and
``expert_weights`` (B, T, k) (TransformerLens' ``hook_expert_indices`` is the indices as (B T, k);
its ``hook_expert_weights`` sits on softmax(r) over all E before top-k, where blocklab's holds the k weights
each expert's output is multiplied by), ``out``; each expert's own stages (``experts.{e}.hidden`` ...) on
the tokens it was given, (N_e, d_ff), the tokens that chose it first, then second, ... (``expert_tokens``;
not per position: no tracer record); with a shared expert, before ``out``, its stages (``shared.hidden``
... ``shared.out``) and its gate's sigmoid(x Wg^T) ``shared_gate`` (B, T, 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .feedforward import FeedForward
from .hooks import HookPoint


def _softmax_then_top_k(logits: Tensor, k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """p = softmax(r) over all E; the k largest p (divided by their sum when ``renormalize``)."""
    probs = F.softmax(logits, dim=-1)  # (..., E)
    weights, indices = torch.topk(probs, k, dim=-1)  # (..., k) each
    return (weights / weights.sum(dim=-1, keepdim=True) if renormalize else weights), indices


def _top_k_then_softmax(logits: Tensor, k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """softmax over the k largest logits (their weights sum to 1 already)."""
    top, indices = torch.topk(logits, k, dim=-1)  # (..., k) each
    return F.softmax(top, dim=-1), indices


# ffn_kinds.ROUTINGS' records, by name: the function each one names
ROUTE: dict[str, Callable[[Tensor, int, bool], tuple[Tensor, Tensor]]] = {
    "before_top_k": _softmax_then_top_k, "after_top_k": _top_k_then_softmax}


def routing_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the routing runs in: float32, or x's when wider (float64)."""
    return torch.promote_types(dtype, torch.float32)


class MixtureOfExperts(nn.Module):
    """Keys: ``router.weight (E, d)``, ``experts.{e}.w1/w2(/w3).*`` (FeedForward's), and with a shared
    expert ``shared.*`` and ``shared_gate.weight (1, d)``.

    ``router_logits``: the last forward's logits (B, T, E), kept with their graph for the training loop's
    load-balancing loss (``load_balancing_loss``), as transformers returns them with ``output_router_logits``.
    """

    stages = ("router_logits", "expert_indices", "expert_weights", "out")

    def __init__(
        self, d_model: int, d_ff: int, activation: str, n_experts: int, experts_per_token: int,
        router_softmax: str = "before_top_k", renormalize_top_k: bool = True, shared_expert_d_ff: int = 0,
        bias: bool = True, dropout: float = 0.0, fused: bool = True,
        device: torch.device | str | None = None, dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= experts_per_token <= n_experts:
            raise ValueError(f"MixtureOfExperts experts_per_token={experts_per_token} must be in "
                             f"[1, n_experts={n_experts}]")
        factory = {"device": device, "dtype": dtype}
        expert = lambda width: FeedForward(d_model, width, activation, bias, dropout, fused=fused, **factory)
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.n_experts, self.top_k, self.router_softmax = n_experts, experts_per_token, router_softmax
        self.renormalize = renormalize_top_k
        self._route = ROUTE[router_softmax]
        self.router = nn.Linear(d_model, n_experts, bias=False, **factory)
        self.experts = nn.ModuleList(expert(d_ff) for _ in range(n_experts))
        self.shared = expert(shared_expert_d_ff) if shared_expert_d_ff else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False, **factory) if shared_expert_d_ff else None
        for stage in self.stages:
            setattr(self, f"hook_{stage}", HookPoint())
        self.hook_shared_gate = HookPoint() if shared_expert_d_ff else None
        if self.shared is not None:  # per position, as the mixture's own: (B, T, width)
            self.stages = (*self.stages[:-1], *(f"shared.{s}" for s in self.shared.stages), "shared_gate",
                           self.stages[-1])
        self.router_logits: Tensor | None = None

    def route(self, logits: Tensor) -> tuple[Tensor, Tensor]:  # (B, T, E) -> (B, T, k) each
        """Each token's k experts and their weights (computed in float32 at least, cast to logits' dtype)."""
        weights, indices = self._route(logits.to(routing_dtype(logits.dtype)), self.top_k, self.renormalize)
        return weights.to(logits.dtype), indices

    def forward(self, x: Tensor) -> Tensor:  # (B, T, d_model)
        logits = self.hook_router_logits(self.router(x))  # (B, T, E)
        self.router_logits = logits
        weights, indices = self.route(logits)
        indices = self.hook_expert_indices(indices)  # (B, T, k)
        weights = self.hook_expert_weights(weights)  # (B, T, k)
        flat, k = x.reshape(-1, self.d_model), self.top_k  # (N, d)
        chosen, w = indices.reshape(-1, k), weights.reshape(-1, k)  # (N, k) each
        out = torch.zeros_like(flat)  # (N, d)
        for e, expert in enumerate(self.experts):  # each expert on its tokens only; every expert is called
            token, slot = expert_tokens(chosen, e)  # (N_e,) each: which token, its j-th choice
            out = out.index_add(0, token, expert(flat[token]) * w[token, slot, None])
        out = out.view_as(x)  # (B, T, d)
        if self.shared is not None:
            shared = self.shared(x)  # (B, T, d)
            gate = self.hook_shared_gate(torch.sigmoid(self.shared_gate(x)))  # (B, T, 1)
            out = out + gate * shared
        return self.hook_out(out)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}, "
                f"n_experts={self.n_experts}, top_k={self.top_k}, router_softmax={self.router_softmax!r}")


def expert_tokens(chosen: Tensor, e: int) -> tuple[Tensor, Tensor]:
    """Which tokens went to expert ``e`` and as their which choice, (N_e,) each, from chosen (N, k): in the
    order of the expert's rows, by choice then token (transformers' and TransformerLens' order, so that its
    stages' rows are theirs)."""
    slot, token = torch.where(chosen.T == e)  # (k, N): the first choices first
    return token, slot


def expert_token_counts(indices: Tensor, n_experts: int, mask: Tensor | None = None) -> Tensor:
    """How many (token, choice) pairs went to each expert: (E,) from indices (B, T, k); ``mask`` (B, T), 1 on
    the tokens counted (padding left out)."""
    chosen = indices if mask is None else indices[mask.bool()]
    return torch.bincount(chosen.reshape(-1), minlength=n_experts)


def load_balancing_loss(router_logits: Iterable[Tensor], top_k: int, mask: Tensor | None = None) -> Tensor:
    """Switch Transformer's auxiliary loss over every layer's logits (B, T, E) at once, as transformers'
    ``load_balancing_loss_func``: E * sum_{j,e} f_{j,e} P_e (module docstring); ``mask`` (B, T), 1 on the
    tokens counted."""
    logits = torch.stack(list(router_logits))  # (L, B, T, E)
    n_experts = logits.shape[-1]
    probs = F.softmax(logits.to(routing_dtype(logits.dtype)), dim=-1)  # (L, B, T, E)
    chosen = F.one_hot(torch.topk(probs, top_k, dim=-1).indices, n_experts).to(probs.dtype)  # (L, B, T, k, E)
    keep = torch.ones(logits.shape[1:3], dtype=probs.dtype, device=probs.device) if mask is None \
        else mask.to(probs.dtype)  # (B, T)
    counted = keep.sum() * logits.shape[0]  # tokens over all layers
    share = (chosen * keep[None, :, :, None, None]).sum(dim=(0, 1, 2)) / counted  # (k, E): f
    mean_prob = (probs * keep[None, :, :, None]).sum(dim=(0, 1, 2)) / counted  # (E,): P
    return n_experts * (share * mean_prob).sum()


def model_router_logits(model: nn.Module) -> list[Tensor]:
    """Every mixture's router logits from the model's last forward, in layer order ([] without experts)."""
    return [m.router_logits for m in model.modules()
            if isinstance(m, MixtureOfExperts) and m.router_logits is not None]


def balancing_term(model: nn.Module, mask: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """(aux, router_aux_loss_coef * aux): the load-balancing loss of the model's last forward and the term
    training adds to its loss (``model.config``'s k and coefficient); None when it has no experts."""
    logits = model_router_logits(model)
    if not logits:
        return None
    aux = load_balancing_loss(logits, model.config.experts_per_token, mask)
    return aux, model.config.router_aux_loss_coef * aux
