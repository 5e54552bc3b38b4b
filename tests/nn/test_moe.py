"""The mixture-of-experts FFN against transformers' MixtralSparseMoeBlock and its load-balancing loss, and
against a float64 hand forward written here (a loop over tokens) that shares no blocklab code."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

from blocklab import ModelConfig, Transformer
from blocklab.nn.moe import MixtureOfExperts, expert_token_counts, load_balancing_loss
from blocklab.nn.params import count_parameters

D, FF, E = 12, 20, 5


def _pair(k: int, dtype: torch.dtype) -> tuple[MixtureOfExperts, MixtralSparseMoeBlock]:
    """A blocklab mixture and transformers' Mixtral block with the same random weights."""
    torch.manual_seed(k)
    ours = MixtureOfExperts(D, FF, "swiglu", E, k, bias=False, dtype=dtype)
    theirs = MixtralSparseMoeBlock(MixtralConfig(hidden_size=D, intermediate_size=FF, num_local_experts=E,
                                                 num_experts_per_tok=k, hidden_act="silu")).to(dtype)
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.router.weight)
        for mine, hf in zip(ours.experts, theirs.experts, strict=True):
            for name in ("w1", "w2", "w3"):
                getattr(hf, name).weight.copy_(getattr(mine, name).weight)
    return ours, theirs


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-6)])
def test_moe_matches_transformers_mixtral_block_values_and_gradients(k: int, dtype: torch.dtype,
                                                                      tol: float) -> None:
    # float64 tolerance 1e-6: transformers computes the routing softmax in float32 whatever the dtype
    ours, theirs = _pair(k, dtype)
    x = torch.randn(3, 7, D, dtype=dtype, requires_grad=True)
    out = ours(x)
    ref, ref_logits = theirs(x)
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    torch.testing.assert_close(ours.router_logits.reshape(-1, E), ref_logits, atol=0, rtol=0)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, ours.router.weight, *ours.experts.parameters()], g)
    ref_grads = torch.autograd.grad(ref, [x, theirs.gate.weight,
                                          *(p for e in theirs.experts for p in (e.w1.weight, e.w2.weight,
                                                                                e.w3.weight))], g)
    # blocklab's experts hold w1, w2, w3 in that order, as transformers' expert does
    for mine, hf in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(mine, hf, atol=tol, rtol=tol)


def _hand_moe(x: torch.Tensor, router: torch.Tensor, experts: list[tuple[torch.Tensor, ...]], k: int,
              renormalize: bool, after: bool, shared: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Token by token in float64: logits, the k largest, their weights, the weighted sum of SwiGLU experts."""
    silu = lambda v: v / (1 + torch.exp(-v))
    ffn = lambda v, w1, w2, w3: w2 @ (silu(w1 @ v) * (w3 @ v))
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            v = x[b, t]
            logits = [float(r) for r in router @ v]
            order = sorted(range(len(logits)), key=lambda e: -logits[e])[:k]
            if after:
                z = [math.exp(logits[e]) for e in order]
                weights = [w / sum(z) for w in z]
            else:
                total = sum(math.exp(v_) for v_ in logits)
                weights = [math.exp(logits[e]) / total for e in order]
                if renormalize:
                    weights = [w / sum(weights) for w in weights]
            out[b, t] = sum(w * ffn(v, *experts[e]) for w, e in zip(weights, order, strict=True))
            if shared is not None:
                *weights_s, gate = shared
                out[b, t] += 1 / (1 + math.exp(-float(gate @ v))) * ffn(v, *weights_s)
    return out


@pytest.mark.parametrize("k, routing, renormalize, shared", [
    (2, "before_top_k", True, 0), (2, "before_top_k", False, 0), (3, "after_top_k", True, 0),
    (1, "before_top_k", False, 8), (4, "before_top_k", True, 8)])
def test_moe_matches_a_float64_hand_forward(k: int, routing: str, renormalize: bool, shared: int) -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(D, FF, "swiglu", E, k, routing, renormalize, shared, bias=False,
                           dtype=torch.float64)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    experts = [(e.w1.weight, e.w2.weight, e.w3.weight) for e in moe.experts]
    shared_weights = None if not shared else (
        moe.shared.w1.weight, moe.shared.w2.weight, moe.shared.w3.weight, moe.shared_gate.weight[0])
    with torch.no_grad():
        after = routing == "after_top_k"
        ref = _hand_moe(x, moe.router.weight, experts, k, renormalize, after, shared_weights)
        torch.testing.assert_close(moe(x), ref, atol=1e-13, rtol=1e-13)


def test_skipping_the_renormalisation_is_caught() -> None:
    # the mutant: Mixtral's weights without their division by the top-k sum
    ours, theirs = _pair(2, torch.float64)
    ours.renormalize = False
    with torch.no_grad():
        x = torch.randn(2, 6, D, dtype=torch.float64)
        assert not torch.allclose(ours(x), theirs(x)[0], atol=1e-3)


def test_moe_gradcheck_in_float64() -> None:
    torch.manual_seed(1)
    moe = MixtureOfExperts(4, 6, "gelu", 3, 2, shared_expert_d_ff=5, dtype=torch.float64)
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: moe(v), (x,))


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_matches_transformers(masked: bool) -> None:
    torch.manual_seed(2)
    logits = [torch.randn(3, 7, E) for _ in range(4)]  # four layers' (B, T, E)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :3] = 0
    mask[2, :1] = 0
    ref = load_balancing_loss_func(tuple(v.reshape(-1, E) for v in logits), E, 2, mask if masked else None)
    ours = load_balancing_loss(logits, 2, mask if masked else None)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)


def test_balanced_routing_gives_the_loss_its_minimum_one() -> None:
    # uniform probabilities and every expert chosen equally often: E * sum_e (1/E)(1/E) * k / k = 1 per choice
    logits = torch.zeros(1, 4, 4)
    logits[0, torch.arange(4), torch.arange(4)] = 1e-9  # ties broken one token per expert
    assert float(load_balancing_loss([logits], 1)) == pytest.approx(1.0, abs=1e-6)


def test_expert_token_counts_leave_padding_out() -> None:
    indices = torch.tensor([[[0, 1], [1, 2]], [[2, 0], [0, 0]]])  # (B=2, T=2, k=2)
    mask = torch.tensor([[1, 1], [0, 1]])
    assert expert_token_counts(indices, 4).tolist() == [4, 2, 2, 0]
    assert expert_token_counts(indices, 4, mask).tolist() == [3, 2, 1, 0]


MOE = dict(vocab_size=30, max_seq_len=16, d_model=16, n_heads=2, d_ff=24, activation="swiglu", norm="rms",
           norm_position="pre", bias=False, causal=True, pos_encoding="rotary", n_experts=4)


@pytest.mark.parametrize("changes", [{}, {"shared_expert_d_ff": 8}, {"experts_per_token": 1},
                                     {"activation": "gelu", "bias": True}])
def test_params_counts_total_and_active_per_token(changes: dict) -> None:
    config = ModelConfig(**{**MOE, **changes})
    model = Transformer(config)
    count = count_parameters(config)
    assert count.total == sum(p.numel() for p in model.parameters())
    idle = config.n_experts - config.experts_per_token
    per_expert = sum(p.numel() for p in model.blocks[0].ffn.experts[0].parameters())
    assert count.active == count.total - idle * per_expert * config.n_layers
    ffn = model.blocks[0].ffn
    assert count.ffn_parts["router"] == sum(p.numel() for p in ffn.router.parameters())
    assert count.ffn_parts["experts"] == sum(p.numel() for p in ffn.experts.parameters())
    shared = [*ffn.shared.parameters(), *ffn.shared_gate.parameters()] if ffn.shared is not None else []
    assert count.ffn_parts.get("shared_expert", 0) == sum(p.numel() for p in shared)
    # the mixture stays one ffn component (what the FFN's share of a model reads), its parts summing to it
    assert count.per_layer["ffn"] == sum(p.numel() for p in ffn.parameters()) == sum(count.ffn_parts.values())
    assert count.components["blocks.ffn"] == count.per_layer["ffn"] * config.n_layers
    assert sum(count.components.values()) == count.total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_mixture_model_trains_in_every_dtype(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**MOE)).to(dtype)
    tokens = torch.randint(0, 30, (2, 8))
    _, loss = model(tokens, tokens)
    assert model.blocks[0].ffn.router_logits.dtype == dtype
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads if g is not None)
    assert model.blocks[0].ffn.router.weight.grad.abs().sum() > 0  # the router learns through the weights


@pytest.mark.parametrize("fields, words", [
    ({"experts_per_token": 1}, "ModelConfig.experts_per_token=1 applies to a mixture of experts, but "
     "n_experts=0"),
    ({"shared_expert_d_ff": 8}, "ModelConfig.shared_expert_d_ff=8 applies to a mixture of experts"),
    ({"n_experts": 4, "experts_per_token": 5}, "ModelConfig.experts_per_token=5 must be an integer in [1, "
     "n_experts=4]"),
    ({"n_experts": -1}, "ModelConfig.n_experts=-1 must be an integer >= 0"),
    ({"n_experts": 4, "router_softmax": "after_top_k", "renormalize_top_k": False},
     "ModelConfig.renormalize_top_k=False cannot apply: router_softmax='after_top_k'"),
    ({"n_experts": 4, "router_softmax": "sparsemax"}, "ModelConfig.router_softmax='sparsemax' is not one of"),
    ({"n_experts": 4, "router_aux_loss_coef": -0.1},
     "ModelConfig.router_aux_loss_coef=-0.1 must be a finite"),
    ({"n_experts": 4, "fused": True, "norm_position": "pre", "keep_residual": True},
     "n_experts=4 has no lean wiring"),
])
def test_mixture_fields_are_validated_by_name(fields: dict, words: str) -> None:
    with pytest.raises(ValueError) as info:
        ModelConfig(**fields)
    assert words in str(info.value)
