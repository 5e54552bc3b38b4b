"""QK-norm (blocklab/nn/attention.py): a norm on queries and keys, per head (Qwen3) or over all heads
(OLMo 2). Elsewhere: every stage against a float64 hand forward (tests/nn/test_hooks.py, the qk-norm
variants), the lean path and an intervention on the normalised keys (tests/nn/test_rotary.py), the
families' weights against ``transformers`` (tests/weights/test_hf_families.py). Here: ``transformers``'
own attention modules with the same weights, float64 gradients, what the norm is for (scores that do
not grow with Wq and Wk), the KV cache, counts and refusals."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Olmo2Config, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

import blocklab as bl
from blocklab.nn.attention import MultiHeadAttention
from blocklab.nn.generate import new_kv_cache
from blocklab.nn.params import count_parameters
from blocklab.nn.rotary import Rotary

D, H, T = 32, 4, 7


def _attention(qk_norm: str, kv_heads: int, **kw: object) -> MultiHeadAttention:
    torch.manual_seed(0)
    ours = MultiHeadAttention(D, H, causal=True, bias=False, n_kv_heads=kv_heads, rotary=True,
                              qk_norm=qk_norm, norm="rms", eps=1e-6, dtype=torch.float64, **kw)
    with torch.no_grad():  # gammas off their init of ones, so a wrong one shows
        for norm in (ours.q_norm, ours.k_norm):
            norm.weight.add_(0.3 * torch.randn_like(norm.weight))
    return ours


@pytest.mark.parametrize("kv_heads", [H, 2, 1])
@pytest.mark.parametrize(("qk_norm", "family"), [("head", "qwen3"), ("all_heads", "olmo2")])
def test_equals_transformers_attention_with_the_same_weights(qk_norm: str, family: str,
                                                             kv_heads: int) -> None:
    """Qwen3Attention (a d_k-wide norm per head) and Olmo2Attention (as wide as q and k)."""
    ours = _attention(qk_norm, kv_heads)
    fields = dict(hidden_size=D, num_attention_heads=H, num_key_value_heads=kv_heads, rms_norm_eps=1e-6,
                  attention_bias=False, rope_theta=10000.0, max_position_embeddings=64)
    config = Qwen3Config(**fields, head_dim=D // H) if family == "qwen3" else Olmo2Config(**fields)
    config._attn_implementation = "eager"
    theirs = (Qwen3Attention if family == "qwen3" else Olmo2Attention)(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for name in "qkvo":
            getattr(theirs, f"{name}_proj").weight.copy_(getattr(ours, name).weight)
        theirs.q_norm.weight.copy_(ours.q_norm.weight)
        theirs.k_norm.weight.copy_(ours.k_norm.weight)
    x = torch.randn(2, T, D, dtype=torch.float64)
    positions = torch.arange(T)[None].expand(2, T)
    angles = Rotary(D // H).angles(positions, x.dtype)
    cos, sin = LlamaRotaryEmbedding(config)(x, positions)  # the same angles, to float32's rounding
    torch.testing.assert_close(angles.cos[:, 0], cos, rtol=0, atol=1e-7)
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    want = theirs(x, (angles.cos[:, 0], angles.sin[:, 0]), causal)[0]  # the rotation isolated from the angles
    got = ours(x, angles=angles)
    # transformers' RMSNorm computes in float32 whatever the input (Qwen3RMSNorm, Olmo2RMSNorm): float32's
    # rounding is the agreement to expect (exact float64: the hand forward of tests/nn/test_hooks.py)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("qk_norm", ["head", "all_heads"])
def test_gradients_pass_float64_gradcheck(qk_norm: str, fused: bool) -> None:
    ours = _attention(qk_norm, 2, fused=fused)
    x = torch.randn(2, 4, D, dtype=torch.float64, requires_grad=True)
    angles = Rotary(D // H).angles(torch.arange(4)[None].expand(2, 4), torch.float64)
    for fast in (True, False):
        ours.use_fast_path = fast
        assert torch.autograd.gradcheck(lambda x, *p: ours(x, angles=angles), (x, *ours.parameters()))


def _model(**fields: object) -> bl.Transformer:
    torch.manual_seed(0)
    llama = dict(causal=True, norm_position="pre", norm="rms", activation="swiglu", bias=False,
                 pos_encoding="rotary")
    config = bl.ModelConfig(vocab_size=23, max_seq_len=16, d_model=D, n_heads=H, n_layers=2, d_ff=48,
                            **{**llama, **fields})
    return bl.Transformer(config).eval()


def test_the_scores_do_not_grow_with_the_query_and_key_weights() -> None:
    """What QK-norm is for (Dehghani et al. 2023): scaling Wq and Wk by 100 multiplies the plain
    scores by 10^4; with an RMSNorm per head they stay put, and stay within max|gamma_q| max|gamma_k|
    sqrt(d_k) (each normalised head has length sqrt(d_k) before gamma)."""
    tokens = torch.randint(0, 23, (1, 9))
    scores = {}
    for qk_norm in ("none", "head"):
        model = _model(qk_norm=qk_norm, eps=1e-10).double()  # eps aside, RMSNorm ignores q's and k's scale
        for scale in (1.0, 100.0):
            if scale != 1.0:
                with torch.no_grad():
                    model.blocks[1].attn.q.weight.mul_(scale)  # the scored block's only
                    model.blocks[1].attn.k.weight.mul_(scale)
            _, cache = model.run_with_cache(tokens, names=["blocks.1.attn.scores"])
            s = cache["blocks.1.attn.scores"]
            scores[qk_norm, scale] = s[torch.isfinite(s)]
    torch.testing.assert_close(scores["none", 100.0], 1e4 * scores["none", 1.0], rtol=1e-9, atol=0)
    torch.testing.assert_close(scores["head", 100.0], scores["head", 1.0], rtol=1e-4, atol=1e-6)
    attn = model.blocks[1].attn
    bound = float(attn.q_norm.weight.abs().max() * attn.k_norm.weight.abs().max()) * math.sqrt(D // H)
    assert float(scores["head", 100.0].abs().max()) <= bound


def test_cached_decoding_equals_the_full_forward() -> None:
    """Keys are normalised (and rotated) before the KV cache stores them: token-by-token decoding
    through the cache gives the full forward's logits."""
    model = _model(qk_norm="head", n_kv_heads=2).double()
    tokens = torch.randint(0, 23, (2, 10))
    full = model(tokens)
    cache = new_kv_cache(model, 2, 10)
    steps = [model.head(model.encode(tokens[:, t:t + 1], kv_cache=cache)) for t in range(10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("qk_norm", "extra"), [("head", 2 * (D // H)), ("all_heads", D + 2 * (D // H))])
def test_parameters_are_the_norms_gammas_counted_beside_the_model(qk_norm: str, extra: int) -> None:
    """Per head: two gammas of d_k; over all heads: q's d and k's h_kv d_k (here one key/value head pair)."""
    model = _model(qk_norm=qk_norm, n_kv_heads=2)
    plain = _model(n_kv_heads=2)
    built = sum(p.numel() for p in model.parameters())
    assert built - sum(p.numel() for p in plain.parameters()) == 2 * extra  # two layers
    assert count_parameters(model.config).total == built


def test_a_qk_norm_without_a_layer_norm_variant_or_with_an_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ModelConfig.qk_norm='head' .* norm='batch'"):
        bl.ModelConfig(qk_norm="head", norm="batch")
    with pytest.raises(ValueError, match=r"qk_norm='per_head' is not one of: none, head, all_heads"):
        bl.ModelConfig(qk_norm="per_head")
    with pytest.raises(ValueError, match="qk_norm='head' needs a LayerNorm variant"):
        MultiHeadAttention(8, 2, qk_norm="head", norm="none")


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("qk_norm", ["head", "all_heads"])
def test_bfloat16_runs_close_to_float32(qk_norm: str, fused: bool) -> None:
    """The model in bfloat16 (lean path and module by module): the logits within bfloat16's rounding of
    the float32 model's (8 significant bits: 1% of their scale); a gamma's gradient sums B T h = 72
    rounded terms, so about sqrt(72) 2^-8 = 3.3% of its scale."""
    tokens = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(3))
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        model = _model(qk_norm=qk_norm, n_kv_heads=2, fused=fused).to(dtype)
        assert model.blocks[0].uses_lean_path is fused
        logits, loss = model(tokens, targets=tokens)
        grads = torch.autograd.grad(loss, [b.attn.q_norm.weight for b in model.blocks] + [model.embed.weight])
        results.append([logits.detach(), *grads])
    for i, (low, high) in enumerate(zip(results[1], results[0], strict=True)):
        assert low.dtype == torch.bfloat16
        share = 0.01 if i == 0 else 0.04  # the logits; the gradients
        torch.testing.assert_close(low.float(), high, rtol=0, atol=share * float(high.abs().max()))
