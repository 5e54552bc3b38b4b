"""MultiHeadAttention against nn.MultiheadAttention and a float64 formula; fast path == explicit path."""

import math

import pytest
import torch
from torch import nn

from blocklab import MultiHeadAttention

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    """nn.MultiheadAttention with the same weights: in_proj = [q; k; v], out_proj = o."""
    ref = nn.MultiheadAttention(
        ours.d_model, ours.n_heads, bias=ours.q.bias is not None, batch_first=True, dtype=ours.q.weight.dtype
    )
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q.weight, ours.k.weight, ours.v.weight]))
        ref.out_proj.weight.copy_(ours.o.weight)
        if ours.q.bias is not None:
            ref.in_proj_bias.copy_(torch.cat([ours.q.bias, ours.k.bias, ours.v.bias]))
            ref.out_proj.bias.copy_(ours.o.bias)
    return ref.eval()


def padding_mask(lengths: list[int], T: int) -> torch.Tensor:
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # True = padding


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_torch_multihead_attention(dtype, causal, bias, padded) -> None:
    T = 7
    ours = MultiHeadAttention(32, 4, causal=causal, bias=bias, dtype=dtype)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.2)
    x = torch.randn(3, T, 32, dtype=dtype)
    kpm = padding_mask([7, 5, 2], T) if padded else None
    causal_mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = masked
    expected, _ = torch_mha(ours)(x, x, x, key_padding_mask=kpm, attn_mask=causal_mask, need_weights=False)
    for fast in (True, False):
        ours.use_fast_path = fast
        torch.testing.assert_close(ours(x, kpm), expected, rtol=0, atol=TOL[dtype])


def test_explicit_weights_follow_the_formula_in_float64() -> None:
    ours = MultiHeadAttention(12, 3, causal=True, dtype=torch.float64)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    out, weights = ours.forward_with_weights(x)
    q = (x @ ours.q.weight.T + ours.q.bias).view(2, 5, 3, 4).transpose(1, 2)
    k = (x @ ours.k.weight.T + ours.k.bias).view(2, 5, 3, 4).transpose(1, 2)
    v = (x @ ours.v.weight.T + ours.v.bias).view(2, 5, 3, 4).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(4) + torch.full((5, 5), -math.inf).triu(1).double()
    expected_w = torch.exp(scores - scores.amax(-1, keepdim=True))
    expected_w = expected_w / expected_w.sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected_w, rtol=0, atol=1e-12)
    concat = (expected_w @ v).transpose(1, 2).reshape(2, 5, 12)
    torch.testing.assert_close(out, concat @ ours.o.weight.T + ours.o.bias, rtol=0, atol=1e-12)
    assert torch.all(weights.triu(1) == 0)  # position i sees j <= i


def test_padding_keys_get_zero_weight_and_do_not_change_real_outputs() -> None:
    ours = MultiHeadAttention(16, 2, dtype=torch.float64)
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    kpm = padding_mask([4], 6)
    out, weights = ours.forward_with_weights(x, kpm)
    assert torch.all(weights[..., 4:] == 0)
    short = ours(x[:, :4])
    torch.testing.assert_close(out[:, :4], short, rtol=0, atol=1e-12)
    garbage = x.clone()
    garbage[:, 4:] = 1e3
    torch.testing.assert_close(ours(garbage, kpm)[:, :4], short, rtol=0, atol=1e-12)


def test_head_i_owns_rows_i_dk_to_i_plus_1_dk() -> None:
    ours = MultiHeadAttention(12, 3, dtype=torch.float64)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    _, before = ours.forward_with_weights(x)
    with torch.no_grad():
        ours.q.weight[4:8].mul_(5.0)  # rows of head 1
    _, after = ours.forward_with_weights(x)
    assert (after[:, 1] - before[:, 1]).abs().max() > 1e-3
    torch.testing.assert_close(after[:, [0, 2]], before[:, [0, 2]], rtol=0, atol=0)


def test_gradcheck_both_paths() -> None:
    ours = MultiHeadAttention(8, 2, causal=True, dtype=torch.float64)
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    for fast in (True, False):
        ours.use_fast_path = fast
        assert torch.autograd.gradcheck(lambda x, *p: ours(x), (x, *ours.parameters()))


def test_parameter_count_layout_and_errors() -> None:
    assert sum(p.numel() for p in MultiHeadAttention(64, 4, bias=False).parameters()) == 16_384
    assert sum(p.numel() for p in MultiHeadAttention(64, 4).parameters()) == 16_640
    assert set(MultiHeadAttention(8, 2).state_dict()) == {
        f"{n}.{w}" for n in "qkvo" for w in ("weight", "bias")
    }
    with pytest.raises(ValueError, match="n_heads=3 must divide d_model=64"):
        MultiHeadAttention(64, 3)


def test_hooking_weights_switches_to_explicit_path_with_same_output() -> None:
    ours = MultiHeadAttention(16, 4, causal=True)
    x = torch.randn(2, 6, 16)
    fast = ours(x)
    seen = []
    ours.hook_weights.fns.append(lambda t, n: seen.append(t))
    torch.testing.assert_close(ours(x), fast, rtol=0, atol=1e-6)
    assert seen and seen[0].shape == (2, 4, 6, 6)
