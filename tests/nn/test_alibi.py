"""ALiBi (blocklab/nn/alibi.py, issue 39 item 2) against its formula and a float64 hand attention."""

from __future__ import annotations

import math

import pytest
import torch

import blocklab as bl
from blocklab.inspect.trace import collect_trace
from blocklab.nn.alibi import alibi_slopes
from blocklab.nn.attention import MultiHeadAttention
from blocklab.nn.config import POS_ENCODINGS
from blocklab.nn.generate import generate, new_kv_cache
from blocklab.nn.params import count_parameters


def paper_slopes(n: int) -> list[float]:
    """The paper's rule, as its text states it: a geometric sequence starting at and stepping by
    2^(-8/n) for n a power of two; else the closest power of two p below n, then every other slope of 2p
    heads (the 1st, 3rd, ...) until there are n."""
    if n & (n - 1) == 0:
        start = 2 ** (-8 / n)
        return [start * start**i for i in range(n)]
    p = 2 ** math.floor(math.log2(n))
    return paper_slopes(p) + paper_slopes(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("n", [*range(1, 17), 12, 24, 40])
def test_slopes_follow_the_paper_for_any_head_count(n: int) -> None:
    assert alibi_slopes(n) == pytest.approx(paper_slopes(n), rel=1e-14, abs=0)  # the product form rounds


def test_slopes_of_eight_and_twelve_heads_by_hand() -> None:
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]  # 1/2, 1/4, ..., 1/256
    assert alibi_slopes(12)[8:] == pytest.approx([2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5], rel=1e-15)


def hand_attention(x, w, h, causal, pad=None):
    """softmax(Q K^T / sqrt(d) - m_h |i - j| + mask) V Wo^T + bo in plain float64 torch: (out, scores)."""
    B, T, d = x.shape
    dk = d // h
    split = lambda y: y.view(B, T, h, dk).transpose(1, 2)
    q, k, v = (split(x @ w[n + ".weight"].T + w[n + ".bias"]) for n in "qkv")
    m = torch.tensor(paper_slopes(h), dtype=torch.float64)
    i = torch.arange(T, dtype=torch.float64)
    bias = -m[:, None, None] * (i[:, None] - i[None, :]).abs()
    scores = q @ k.transpose(-1, -2) / math.sqrt(dk) + bias
    allowed = torch.ones(B, 1, T, T, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool).tril()
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    z = torch.softmax(scores, -1) @ v
    return z.transpose(1, 2).reshape(B, T, d) @ w["o.weight"].T + w["o.bias"], scores


def _attention(d: int, h: int, causal: bool) -> MultiHeadAttention:
    torch.manual_seed(d * 31 + h)
    attn = MultiHeadAttention(d, h, causal=causal, alibi=True, dtype=torch.float64)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.5)
    return attn


SHAPES = [(2, 5, 8, 1), (1, 7, 12, 3), (2, 9, 16, 4), (3, 6, 24, 6), (1, 11, 48, 12)]  # B, T, d, h


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-T{}-d{}-h{}".format(*s))
def test_scores_and_outputs_equal_a_float64_hand_attention(shape, causal: bool) -> None:
    B, T, d, h = shape
    attn = _attention(d, h, causal)
    x = torch.randn(B, T, d, dtype=torch.float64)
    want, want_scores = hand_attention(x, dict(attn.state_dict()), h, causal)
    seen = {}
    attn.hook_scores.observers.append(lambda s, name: seen.update(scores=s))
    fast = attn(x)  # SDPA with the bias as its float mask; observers see the scores computed beside it
    attn.hook_scores.observers.clear()
    explicit, weights = attn.forward_with_weights(x)
    assert (fast - want).abs().max() < 1e-12 and (explicit - want).abs().max() < 1e-12
    assert torch.equal(seen["scores"].isinf(), want_scores.isinf())
    finite = want_scores.isfinite()
    assert (seen["scores"][finite] - want_scores[finite]).abs().max() < 1e-12
    assert (weights - torch.softmax(want_scores, -1)).abs().max() < 1e-13


def test_padding_keys_are_masked_on_top_of_the_bias() -> None:
    attn = _attention(16, 4, causal=False)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    pad = torch.tensor([[False] * 6, [True, True] + [False] * 4])
    want, _ = hand_attention(x, dict(attn.state_dict()), 4, False, pad)
    assert (attn(x, pad) - want).abs().max() < 1e-12
    assert (attn.forward_with_weights(x, pad)[0] - want).abs().max() < 1e-12


@pytest.mark.parametrize("explicit", [False, True], ids=["fast", "explicit"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_gradcheck_in_float64(causal: bool, explicit: bool) -> None:
    attn = _attention(8, 2, causal)
    attn.use_fast_path = not explicit
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(attn, (x,), eps=1e-6, atol=1e-8)


def _config(**overrides) -> bl.ModelConfig:
    base = dict(vocab_size=23, max_seq_len=16, d_model=24, n_heads=6, n_layers=2, d_ff=48, causal=True,
                norm_position="pre", pos_encoding="alibi", embed_scale="none", embed_std=0.5)
    return bl.ModelConfig(**base | overrides)


def _model(dtype=torch.float64, **overrides) -> bl.Transformer:
    torch.manual_seed(0)
    return bl.Transformer(_config(**overrides)).to(dtype).eval()


def test_alibi_adds_nothing_to_x0_and_has_no_parameters() -> None:
    model = _model()
    assert model.pos is None and model.rotary is None
    counted = count_parameters(model.config)
    assert counted.total == sum(p.numel() for p in model.parameters())
    assert counted.total == count_parameters(_config(pos_encoding="none")).total
    assert "pos" not in counted.components
    assert model.blocks[0].attn.alibi == tuple(paper_slopes(6))


@pytest.mark.parametrize("position", ["pre", "post"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_module_path_equals_lean_path(position: str, causal: bool) -> None:
    lean = _model(norm_position=position, causal=causal, fused=True)
    module = _model(norm_position=position, causal=causal, fused=False)
    module.load_state_dict(lean.state_dict())
    assert lean.blocks[0].uses_lean_path and not module.blocks[0].uses_lean_path
    tokens = torch.randint(0, 23, (3, 16))
    a, b = lean(tokens), module(tokens)
    assert (a - b).abs().max() < 1e-12
    lean(tokens).pow(2).mean().backward()
    module(tokens).pow(2).mean().backward()
    for (name, p), q in zip(lean.named_parameters(), module.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max() < 1e-10, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float32_and_bfloat16_follow_float64(dtype: torch.dtype) -> None:
    exact = _model(fused=True)
    low = _model(dtype, fused=True)
    tokens = torch.randint(0, 23, (2, 16))
    want = exact(tokens)
    got = low(tokens)
    assert got.dtype == dtype
    tol = {torch.float32: 1e-5, torch.bfloat16: 0.1}[dtype] * want.abs().max()
    assert (got.double() - want).abs().max() < tol


def test_kv_cache_decoding_equals_the_full_forward() -> None:
    model = _model()
    tokens = torch.randint(0, 23, (2, 16))
    with torch.no_grad():
        full = model.encode(tokens)
        cache = new_kv_cache(model, 2, 16)
        spans = ((0, 5), (5, 6), (6, 11), (11, 16))  # a prompt, one token, then several at once
        chunks = [model.encode(tokens[:, a:b], kv_cache=cache) for a, b in spans]
    assert (torch.cat(chunks, 1) - full).abs().max() < 1e-12


@pytest.mark.parametrize("from_mask", [False, True], ids=["positions-from-0", "positions-from-mask"])
def test_a_left_padded_row_equals_the_row_alone(from_mask: bool) -> None:
    model = _model(positions_from_mask=from_mask)
    row = torch.randint(0, 22, (1, 9))
    ids = torch.cat([torch.cat([torch.full((1, 4), 22), row], dim=1), torch.randint(0, 22, (1, 13))])
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[0, :4] = 0
    padded = model(ids, attention_mask=mask)
    assert (padded[0, 4:] - model(row)[0]).abs().max() < 1e-12


def test_cached_generation_of_a_left_padded_batch_equals_each_row_alone() -> None:
    model = _model(dtype=torch.float32)
    rows = [[3, 4, 5, 6, 7], [8, 9]]
    ids = torch.tensor([rows[0], [22, 22, 22, *rows[1]]])
    mask = (ids != 22).long()
    together = generate(model, ids, attention_mask=mask, max_new_tokens=6)
    for r, row in enumerate(rows):
        alone = generate(model, torch.tensor([row]), max_new_tokens=6)
        assert together[r, -6:].tolist() == alone[0, -6:].tolist()
    assert torch.equal(together, generate(model, ids, attention_mask=mask, max_new_tokens=6, use_cache=False))


def test_max_seq_len_bounds_alibi_and_a_longer_config_runs_the_same_weights_further() -> None:
    model = _model()
    with pytest.raises(ValueError, match="sequence length 20 exceeds max_seq_len=16"):
        model(torch.randint(0, 23, (1, 20)))
    longer = bl.Transformer(_config(max_seq_len=64)).double().eval()
    longer.load_state_dict(model.state_dict())  # no parameter depends on the length
    tokens = torch.randint(0, 23, (2, 64))
    out = longer(tokens)
    assert out.isfinite().all()
    assert (out[:, :16] - model(tokens[:, :16])).abs().max() < 1e-12  # causal: the prefix is unchanged


def test_position_ids_that_skip_are_refused_and_consecutive_ones_change_nothing() -> None:
    model = _model()
    tokens = torch.randint(0, 23, (1, 6))
    shifted = model(tokens, position_ids=torch.arange(3, 9)[None])
    assert (shifted - model(tokens)).abs().max() < 1e-12
    with pytest.raises(ValueError, match="position_ids must count up by one .* pos_encoding='alibi'"):
        model(tokens, position_ids=torch.tensor([[0, 1, 2, 5, 6, 7]]))


def test_the_scores_stage_includes_the_bias_and_the_tracer_says_so() -> None:
    model = _model(n_layers=1)
    tokens = torch.randint(0, 23, (1, 7))
    names = ["blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.scores"]
    _, cache = model.run_with_cache(tokens, names=names)
    q, k = cache["blocks.0.attn.q"], cache["blocks.0.attn.k"]
    i = torch.arange(7.0, dtype=torch.float64)
    want = q @ k.transpose(-1, -2) / 2 - torch.tensor(paper_slopes(6))[:, None, None] * (i[:, None] - i).abs()
    got = cache["blocks.0.attn.scores"]
    lower = torch.ones(7, 7, dtype=torch.bool).tril()
    assert (got[..., lower] - want[..., lower]).abs().max() < 1e-12
    assert got[..., ~lower].isneginf().all()
    trace = collect_trace(model, tokens[0].tolist(), position=6)
    words = {s.name: s.explanation for s in trace.stages}
    assert "- m_h |i - j| (ALiBi" in words["blocks.0.attn.scores"]
    assert "slopes m_h 0.25, 0.0625, 0.01562, 0.003906, 0.5, 0.125 for heads 0..5" \
        in words["blocks.0.attn.scores"], words["blocks.0.attn.scores"]
    assert "x0 = token part;" in words["embed"] and "pos" not in words


def test_every_position_kind_builds_and_runs() -> None:
    assert "alibi" in POS_ENCODINGS
    for kind in POS_ENCODINGS:
        model = _model(pos_encoding=kind)
        assert model(torch.randint(0, 23, (1, 5))).isfinite().all(), kind
