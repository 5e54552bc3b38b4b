"""blocklab bench: FLOP counts against torch's FlopCounterMode, saved bytes and depth memory against
hand counts, the report's structure on a tiny shape, the plot and the CLI. No timed assertions."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from blocklab.bench import (
    PEERS,
    Shape,
    accounting,
    block_flops,
    blocklab_candidate,
    compare,
    depth_memory,
    seq_shapes,
    sweep,
    verdict,
    width_shapes,
)
from blocklab.bench_report import plot_sweeps
from blocklab.cli import main

TINY = Shape(d_model=16, n_heads=2, d_ff=64, batch=2, seq=8)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_block_flops_match_torch_flop_counter(activation) -> None:
    shape = Shape(d_model=32, n_heads=4, d_ff=64, batch=2, seq=16)
    block = blocklab_candidate(shape, activation=activation, fused=False).module
    block.attn.use_fast_path = False  # explicit attention: the counter sees its bmm's (not SDPA's CPU kernel)
    x = torch.randn(2, 16, 32, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        out = block(x)
    with FlopCounterMode(display=False) as backward:
        out.backward(torch.ones_like(out))
    expected = block_flops(shape, gated=activation == "swiglu")
    assert forward.get_total_flops() == expected / 3
    assert backward.get_total_flops() == 2 * expected / 3


def test_accounting_of_the_tiny_block_is_9d_plus_heads() -> None:
    rows = accounting(TINY)
    assert sum(r["floats_per_token"] for r in rows) == 9 * 16 + 2
    savers = {name for r in rows for name in r["saved_by"]}
    assert {"NormLinearBackward", "ResidualNormLinearBackward", "ActLinearBackward"} <= savers


def test_compare_reports_every_block_on_a_tiny_shape() -> None:
    result = compare(TINY, rounds=1, min_seconds=0.0)
    blocks = result["blocks"]
    assert set(PEERS) | {"blocklab", "blocklab-causal", "blocklab-unfused"} == set(blocks)
    assert blocks["blocklab"]["saved_floats_per_token_per_d"] == (9 * 16 + 2) / 16
    assert blocks["blocklab-unfused"]["saved_bytes_per_token"] > blocks["blocklab"]["saved_bytes_per_token"]
    assert blocks["blocklab"]["speedup"] == 1.0 and blocks["blocklab-causal"]["speedup"] == 1.0
    for row in blocks.values():
        assert row["tokens_per_s"] > 0 and row["peak_bytes"] >= row["held_bytes"] > 0
    v = verdict(result)
    assert v["fastest_peer"] in PEERS and v["limit"] == 10.0
    json.dumps(result)  # JSON-ready


def test_depth_memory_matches_the_hand_count() -> None:
    d, H, tokens = 16, 2, 16
    rows = depth_memory(TINY, (1, 3))
    for row in rows:
        n = row["depth"]
        assert row["plain_held_bytes"] == 4 * tokens * n * (9 * d + H)  # every block keeps 9d + H
        assert row["checkpointed_held_bytes"] == 4 * tokens * n * d  # only the block boundaries


def test_sweep_shapes_and_rows(tmp_path) -> None:
    seqs = seq_shapes(TINY, (4, 8, 32), tokens=16)
    assert [(s.seq, s.batch) for s in seqs] == [(4, 4), (8, 2), (32, 1)]
    widths = width_shapes(TINY, (32, 128))
    assert [(s.d_model, s.n_heads, s.d_ff) for s in widths] == [(32, 1, 128), (128, 2, 512)]
    rows = sweep(seqs[:2], rounds=1, min_seconds=0.0)
    assert all(r["blocklab_us_per_token"] > 0 and r["attention_us_per_token"] > 0 for r in rows)
    assert rows[0]["attention_flop_share"] == 4 * 4 / (8 * 16 + 4 * 64 + 4 * 4)
    path = tmp_path / "sweep.png"
    plot_sweeps({"sweep_seq": rows, "sweep_d_model": rows}, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bench_rejects_an_unknown_dtype(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--dtype", "float16"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
