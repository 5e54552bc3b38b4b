"""Gemma 2's soft-capping (attention scores, final logits) and query pre-attention scalar (issue 39 item 3)
against float64 hand computations that share no blocklab code."""

from __future__ import annotations

import math

import pytest
import torch

import blocklab as bl
from blocklab.nn.attention import MultiHeadAttention
from blocklab.nn.generate import generate


def hand_attention(x, w, h, cap, scalar, pad=None):
    """softmax(cap tanh(Q K^T s^-1/2 / cap) + causal mask) V Wo^T + bo in float64 torch: (out, scores)."""
    B, T, d = x.shape
    dk = d // h
    split = lambda y: y.view(B, T, h, dk).transpose(1, 2)
    q, k, v = (split(x @ w[n + ".weight"].T + w[n + ".bias"]) for n in "qkv")
    scores = q @ k.transpose(-1, -2) / math.sqrt(dk if scalar is None else scalar)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    z = torch.softmax(scores, -1) @ v
    return z.transpose(1, 2).reshape(B, T, d) @ w["o.weight"].T + w["o.bias"], scores


CASES = [(0.7, None), (2.0, 5.0), (None, 3.0), (50.0, 256.0)]  # (cap, query_pre_attn_scalar)


@pytest.mark.parametrize("cap,scalar", CASES)
def test_capped_scaled_attention_equals_a_float64_hand_attention(cap, scalar) -> None:
    torch.manual_seed(3)
    d, h, B, T = 16, 4, 2, 7
    attn = MultiHeadAttention(d, h, causal=True, dtype=torch.float64, softcap=cap,
                              scale=None if scalar is None else scalar**-0.5)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.8)  # scores of several units: the cap bends them
    x = torch.randn(B, T, d, dtype=torch.float64)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, :3] = True  # a left-padded row
    want, want_scores = hand_attention(x, dict(attn.state_dict()), h, cap, scalar, pad)
    seen = {}
    attn.hook_scores.observers.append(lambda s, name: seen.update(scores=s))
    out = attn(x, pad)
    real = ~pad[1]  # the padding queries see no key: weights 0 in blocklab, NaN in the hand softmax
    torch.testing.assert_close(out[0], want[0], rtol=0, atol=1e-13)
    torch.testing.assert_close(out[1, real], want[1, real], rtol=0, atol=1e-13)
    torch.testing.assert_close(seen["scores"][0], want_scores[0], rtol=0, atol=1e-13)  # the capped scores
    if cap is not None:
        finite = seen["scores"].isfinite()
        assert seen["scores"][finite].abs().max() <= cap
        raw = hand_attention(x, dict(attn.state_dict()), h, None, scalar, pad)[1]
        assert (raw[raw.isfinite()].abs().max() > cap) == (cap < 5)  # the small caps bend these scores


def test_capped_attention_gradients_pass_gradcheck() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(8, 2, causal=True, dtype=torch.float64, softcap=0.9, scale=0.4)
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: attn(x), (x,))


def _model(**fields) -> bl.Transformer:
    torch.manual_seed(1)
    config = bl.ModelConfig(vocab_size=23, max_seq_len=16, d_model=16, n_heads=4, n_layers=2, d_ff=32,
                            causal=True, norm_position="pre", pos_encoding="rotary", **fields)
    return bl.Transformer(config).double().eval()


def test_final_logits_are_capped_as_the_hand_formula_says() -> None:
    model = _model(logit_softcap=0.8)
    tokens = torch.randint(0, 23, (2, 9))
    with torch.no_grad():
        hidden = model.encode(tokens)
        logits = model(tokens)
    raw = hidden @ model.head.weight.T
    want = 0.8 * torch.tanh(raw / 0.8)
    assert raw.abs().max() > 0.8  # the cap bends some logits
    torch.testing.assert_close(logits, want, rtol=0, atol=1e-14)


def test_cached_generation_of_a_capped_model_equals_the_full_forward() -> None:
    model = _model(attn_softcap=0.6, logit_softcap=1.5, query_pre_attn_scalar=7.0)
    prompt = torch.randint(0, 23, (1, 5))
    cached = generate(model, prompt, max_new_tokens=6)
    uncached = generate(model, prompt, max_new_tokens=6, use_cache=False)
    assert torch.equal(cached, uncached)
    with torch.no_grad():
        full = model(cached[:, :-1])[0, -1]
        stepped = model(cached[:, :-2])[0, -1]
    assert int(full.argmax()) == int(cached[0, -1]) and int(stepped.argmax()) == int(cached[0, -2])


@pytest.mark.parametrize("name", ["attn_softcap", "logit_softcap", "query_pre_attn_scalar"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "50", True])
def test_a_cap_or_scalar_that_is_no_positive_number_is_refused_by_name(name: str, value) -> None:
    with pytest.raises(ValueError, match=f"ModelConfig.{name}=.* must be a finite number > 0"):
        bl.ModelConfig(causal=True, **{name: value})


def test_a_whole_number_cap_is_kept_as_a_float() -> None:
    assert bl.ModelConfig(attn_softcap=50).attn_softcap == 50.0
    assert isinstance(bl.ModelConfig(attn_softcap=50).attn_softcap, float)
