"""blocklab/bench/footprint.py: saved tensors and live bytes of a step, against hand counts."""

import torch
from torch import nn

from blocklab import ModelConfig, TransformerBlock
from blocklab.bench.footprint import LiveBytes, saved_activations, saved_by, step_memory


def test_saved_bytes_of_a_small_mlp_count_each_storage_once_and_no_parameters() -> None:
    mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    x = torch.randn(2, 5, 4, requires_grad=True)
    saved, _ = saved_activations(mlp, mlp, x)
    # Linear 1 keeps x (4 per token); ReLU keeps its output, which Linear 2 keeps too: one storage (6)
    assert saved.nbytes == 4 * 10 * (4 + 6)
    assert len(saved.storages) == 2


def test_a_saved_view_counts_its_whole_storage() -> None:
    x = torch.randn(10, 8, requires_grad=True)
    saved, _ = saved_activations(nn.Identity(), lambda t: (t * 2)[:, :2].exp(), x)
    # exp keeps its output (10 x 2, new storage); mul by a constant keeps nothing
    assert saved.nbytes == 4 * 10 * 2
    saved, _ = saved_activations(nn.Identity(), lambda t: (t * 2)[:, :2].sin(), x)
    assert saved.nbytes == 4 * 10 * 8  # sin keeps its input: a view of the (10, 8) product


def test_unfused_pre_norm_block_saves_its_hand_count() -> None:
    d, H, d_ff, B, T = 8, 2, 12, 2, 3
    config = ModelConfig(d_model=d, n_heads=H, d_ff=d_ff, max_seq_len=T, norm_position="pre",
                         activation="gelu", fused=False)
    block = TransformerBlock(config)
    saved, out = saved_activations(block, block, torch.randn(B, T, d, requires_grad=True))
    tokens = B * T
    per_token = (
        d + 2  # LN1: x, mean, rstd
        + d  # the qkv matmul: LN1(x)
        + 3 * d + H + d  # SDPA: q, k, v (one storage), log-sum-exp, output (= o's input, a view)
        + d + 2 + d  # LN2: y, mean, rstd; W1: LN2(y)
        + d_ff + d_ff  # GELU: h; W2: GELU(h)
    )
    concatenated_qkv_weight = 3 * d * d  # a copy, not a parameter: the unfused path keeps it
    assert saved.nbytes == 4 * (tokens * per_token + concatenated_qkv_weight)
    nodes = saved_by(out)
    assert sum(1 for names in nodes.values() if "NativeLayerNormBackward0" in names) >= 2


def test_live_bytes_counts_new_storages_until_they_are_freed() -> None:
    with LiveBytes() as live:
        a = torch.ones(1000)  # 4000 bytes
        view = a[:10]  # a view: no new memory
        b = a * 2  # 4000 more
        assert live.live == 8000
        del a, view
        assert live.live == 4000
        b.add_(1)  # in place: no new memory
        assert live.live == 4000
    assert live.peak == 8000


def test_step_memory_of_a_linear_layer() -> None:
    linear = nn.Linear(4, 6)
    x = torch.randn(5, 4, requires_grad=True)
    held, peak = step_memory(linear, linear, x)
    assert held == 4 * 5 * 6  # the output; x and the parameters existed before
    assert peak >= held + 4 * 5 * 6  # and the gradient of the output, at least
