"""blocklab bench: FLOP counts against torch's FlopCounterMode, saved bytes and depth memory against
hand counts, ratios and verdicts against hand computations on made-up times, one whole run on a tiny
shape (its structure, its schema, its printout), the plot and the CLI. No timed assertions."""

import json
import statistics
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from blocklab.bench.report import plot_sweeps, print_report
from blocklab.bench.runner import (
    FULL,
    MIN_ROUNDS_FOR_VERDICT,
    PEERS,
    QUICK,
    TOO_FEW_ROUNDS,
    VARIANTS,
    Bootstrap,
    Candidate,
    Plan,
    Shape,
    Target,
    Variant,
    accounting,
    block_flops,
    blocklab_candidate,
    build_candidates,
    compare,
    depth_memory,
    run_bench,
    schema,
    seq_shapes,
    speed_ratios,
    target_verdict,
    verdicts,
    width_shapes,
)
from blocklab.bench.stats import MET, NOT_MET, UNDECIDED
from blocklab.cli import main

TINY = Shape(d_model=16, n_heads=2, d_ff=64, batch=2, seq=8)
TINY_PLAN = Plan("tiny", rounds=3, min_seconds=0.0, seqs=(4, 8), sweep_tokens=16, widths=(16, 32),
                 width_batch=2, sweep_rounds=1, sweep_min_seconds=0.0, depths=(1,), shape=TINY,
                 depth_shape=TINY)
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "bench.json"


@pytest.fixture(scope="module")
def report() -> dict:
    """One whole run at the tiny shape, as its JSON reads back."""
    return json.loads(json.dumps(run_bench(plan=TINY_PLAN)))


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


@pytest.mark.parametrize("config, recomputed_per_token", [
    ({}, 2 * 32 * 32),  # the lean path recomputes s = x + c Wo^T + bo: one (d x d) matmul per token
    ({"keep_residual": True}, 0), ({"fused": False}, 0), ({"norm_position": "post"}, 2 * 32 * 32),
])
def test_recomputed_flops_match_torch_flop_counter(config, recomputed_per_token) -> None:
    """A step's counted FLOPs beyond the module path's (the oracle: FlopCounterMode on both) are what
    the floor credits the block for recomputing."""
    shape = Shape(d_model=32, n_heads=4, d_ff=64, batch=2, seq=16)

    def addmm_inplace(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]  # the counter knows addmm, not its in-place form

    def counted(**fields) -> int:
        torch.manual_seed(0)
        c = blocklab_candidate(shape, **fields)
        x = torch.randn(2, 16, 32, requires_grad=True)
        mapping = {torch.ops.aten.addmm_: addmm_inplace}
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            c.run(x).backward(torch.ones_like(x))
        return counter.get_total_flops()

    base = {k: v for k, v in config.items() if k not in ("fused", "keep_residual")}
    extra = counted(**config) - counted(**base, fused=False)
    candidate = blocklab_candidate(shape, **config)
    assert extra == candidate.recomputed_flops == recomputed_per_token * shape.tokens


def test_accounting_of_the_tiny_block_is_9d_plus_heads() -> None:
    rows = accounting(TINY)
    assert sum(r["floats_per_token"] for r in rows) == 9 * 16 + 2
    savers = {name for r in rows for name in r["saved_by"]}
    assert {"NormLinearBackward", "ResidualNormLinearBackward", "ActLinearBackward"} <= savers


def test_a_tiny_run_reports_every_block_and_follows_its_schema(report) -> None:
    jsonschema.validate(report, schema())
    result = report["compare"]
    blocks = result["blocks"]
    variants = {"blocklab", "blocklab-causal", "blocklab-speed", "blocklab-speed-causal", "blocklab-unfused"}
    assert set(PEERS) | variants == set(blocks)
    assert blocks["blocklab"]["saved_floats_per_token_per_d"] == (9 * 16 + 2) / 16
    assert blocks["blocklab-speed"]["saved_floats_per_token_per_d"] == (10 * 16 + 2) / 16  # and s
    assert blocks["blocklab-unfused"]["saved_bytes_per_token"] > blocks["blocklab"]["saved_bytes_per_token"]
    for row in blocks.values():
        assert row["tokens_per_s"] > 0 and row["peak_bytes"] >= row["held_bytes"] > 0
    assert len(result["noise"]["load_average_per_round"]) == TINY_PLAN.rounds
    rates = result["noise"]["matmul_gflops_per_round"]
    assert len(rates) == TINY_PLAN.rounds and max(rates) == result["matmul_gflops"]  # the best round's rate


def test_every_ratio_is_read_from_the_recorded_rounds(report) -> None:
    result = report["compare"]
    seconds = result["seconds_per_round"]
    assert set(result["ratios"]) == {"blocklab", "blocklab-speed"}  # the variants with a target
    twins = {"blocklab-causal", "blocklab-speed-causal"}
    for variant, ratios in result["ratios"].items():
        assert set(ratios) == set(result["blocks"]) - twins - {variant}
        assert ratios["hf-gpt2"]["against"] == f"{variant}-causal"  # causal peers like for like
        for name, r in ratios.items():
            per_round = [a / b for a, b in zip(seconds[name], seconds[r["against"]], strict=True)]
            assert r["median"] == statistics.median(per_round)
            assert r["best_round"] == min(seconds[name]) / min(seconds[r["against"]])
            assert min(per_round) <= r["low"] <= r["high"] <= max(per_round)


def test_every_floor_is_read_from_the_recorded_rounds(report) -> None:
    result = report["compare"]
    seconds, floors = result["seconds_per_round"], result["floor_seconds_per_round"]
    d, d_ff, tokens = TINY.d_model, TINY.d_ff, TINY.tokens
    linear = 3 * tokens * 2 * (4 * d * d + 2 * d * d_ff)  # q, k, v, o, W1, W2, forward + backward
    probe = 2 * tokens * d * d_ff  # the matmul probe: (tokens x d) @ (d x d_ff)
    for name, row in result["blocks"].items():
        recomputed = 2 * tokens * d * d if name in ("blocklab", "blocklab-causal") else 0
        attention = seconds["attention-causal" if row["causal"] else "attention"]
        expected = [(linear + recomputed) * m / probe + a
                    for m, a in zip(seconds["matmul"], attention, strict=True)]
        assert floors[name] == pytest.approx(expected, rel=1e-12)
        assert row["floor_ms"] == pytest.approx(1e3 * statistics.median(expected), rel=1e-12)
        per_round = [s / f for s, f in zip(seconds[name], expected, strict=True)]
        assert row["over_floor"] == pytest.approx(statistics.median(per_round), rel=1e-12)
    for v in report["verdicts"]:
        f = v["at_floor"]
        against = f"{v['variant']}-causal" if result["blocks"][v["fastest_peer"]]["causal"] else v["variant"]
        assert f["against"] == against
        per_round = [s / fl for s, fl in zip(seconds[v["fastest_peer"]], floors[against], strict=True)]
        assert f["median"] == pytest.approx(statistics.median(per_round), rel=1e-12)
        assert min(per_round) <= f["low"] <= f["high"] <= max(per_round)


def test_the_tiny_run_keeps_more_than_the_targets_so_its_verdicts_are_not_met(report) -> None:
    lean, speed = report["verdicts"]
    assert lean["variant"] == "blocklab" and lean["target"] == {"speed": 1.0, "floats_per_d": 9.05}
    assert lean["floats_per_d"] == 9.125  # 9 d + H at d 16, 2 heads: over 9.05 d whatever the speed
    assert speed["variant"] == "blocklab-speed" and speed["target"] == {"speed": 1.02, "floats_per_d": 10.05}
    assert speed["floats_per_d"] == 10.125  # 10 d + H: over 10.05 d
    for v in (lean, speed):
        assert v["verdict"] == NOT_MET
        peers = {k: r for k, r in report["compare"]["ratios"][v["variant"]].items() if k in PEERS}
        assert v["speed"] == min(peers.values(), key=lambda r: r["median"]) == peers[v["fastest_peer"]]


def test_the_report_prints_the_verdict_interval_and_noise(report, capsys) -> None:
    print_report(report)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    v = report["verdicts"][0]
    speed = v["speed"]
    assert (f"against the fastest peer, {v['fastest_peer']}, {speed['median']:.3f}x (median of 3 rounds; "
            f"95% interval {speed['low']:.3f}-{speed['high']:.3f}; target >= 1.00x") in out
    assert "target blocklab: keeps 9.12 d floats/token (target <= 9.05 d)" in out
    assert "target blocklab-speed: keeps 10.12 d floats/token (target <= 10.05 d)" in out
    assert out.count("NOT met") == 2
    assert "percentile bootstrap of that median (95%, 10,000 resamples of the rounds, seed 0)" in out
    load = report["compare"]["noise"]["load_average_per_round"]
    assert f"noise over the rounds: load average {min(load):.1f}-{max(load):.1f}; matmul rate" in out


def test_the_committed_results_follow_the_schema() -> None:
    jsonschema.validate(json.loads(RESULTS.read_text()), schema())


def _candidate(name: str, variant: str = "", kind: str = "peer", causal: bool = False) -> Candidate:
    return Candidate(name, nn.Identity(), nn.Identity(), causal=causal, variant=variant, kind=kind)


def test_speed_ratios_by_hand() -> None:
    variant = Variant("v", {}, "", Target(speed=1.0, floats_per_d=9.0))
    candidates = [_candidate("v", "v", "variant"), _candidate("v-causal", "v", "causal twin", causal=True),
                  _candidate("p"), _candidate("q", causal=True), _candidate("u", "u", "variant")]
    times = {"v": [1.0, 2.0, 1.0], "v-causal": [0.5, 0.5, 0.4], "p": [1.1, 2.4, 0.9], "q": [0.5, 0.6, 0.2],
             "u": [2.0, 2.0, 2.0]}
    ratios = speed_ratios(candidates, times, [variant, Variant("u", {}, "")], Bootstrap())["v"]
    assert set(ratios) == {"p", "q", "u"}  # not against itself or its twin
    assert ratios["p"]["against"] == "v" and ratios["q"]["against"] == "v-causal"
    assert ratios["p"]["median"] == pytest.approx(1.1)  # 1.1, 1.2, 0.9
    assert ratios["p"]["best_round"] == pytest.approx(0.9)  # 0.9 / 1.0
    assert ratios["q"]["median"] == pytest.approx(1.0)  # 1.0, 1.2, 0.5
    assert ratios["q"]["best_round"] == pytest.approx(0.5)  # 0.2 / 0.4
    assert ratios["u"]["median"] == 2.0 and (ratios["u"]["low"], ratios["u"]["high"]) == (1.0, 2.0)


@pytest.mark.parametrize(("floats", "low", "high", "rounds", "expected"), [
    (9.02, 1.01, 1.04, 30, MET),
    (9.02, 0.97, 0.99, 30, NOT_MET),
    (9.02, 0.99, 1.02, 30, UNDECIDED),  # the interval straddles 1.00x
    (9.10, 1.01, 1.04, 30, NOT_MET),  # over 9.05 d: not met however fast
    (9.10, 1.01, 1.04, 3, NOT_MET),  # the floats are exact, whatever the rounds
    (9.02, 1.01, 1.04, MIN_ROUNDS_FOR_VERDICT - 1, TOO_FEW_ROUNDS),
    (9.02, 1.01, 1.04, MIN_ROUNDS_FOR_VERDICT, MET),
])
def test_target_verdict_by_hand(floats, low, high, rounds, expected) -> None:
    assert target_verdict(floats, low, high, rounds, Target(speed=1.00, floats_per_d=9.05)) == expected


def test_the_fastest_peer_is_the_one_with_the_lowest_median_ratio() -> None:
    def ratio(median: float, low: float, high: float) -> dict:
        return {"against": "blocklab", "median": median, "low": low, "high": high, "best_round": median}

    compared = {
        "rounds": 30,
        "blocks": {"blocklab": {"kind": "variant", "saved_floats_per_token_per_d": 9.02},
                   "blocklab-unfused": {"kind": "variant"}, "a": {"kind": "peer"}, "b": {"kind": "peer"}},
        # the unfused variant is "slower" than any peer, but it is no peer
        "ratios": {"blocklab": {"blocklab-unfused": ratio(0.90, 0.85, 0.95), "a": ratio(1.03, 1.01, 1.05),
                                "b": ratio(0.99, 0.98, 1.02)}},
        "seconds_per_round": {"b": [2.0, 2.2, 2.1]},
        "floor_seconds_per_round": {"blocklab": [2.0, 2.0, 2.0]},
    }
    lean = VARIANTS[:1]
    (v,) = verdicts(compared, lean)
    assert v["fastest_peer"] == "b" and v["verdict"] == UNDECIDED
    # at its floor: b's step over blocklab's floor, 1.0, 1.1, 1.05 in the three rounds
    assert v["at_floor"]["median"] == pytest.approx(1.05) and v["at_floor"]["against"] == "blocklab"
    assert 1.0 <= v["at_floor"]["low"] <= v["at_floor"]["high"] <= 1.1 and v["at_floor"]["verdict"] == MET
    compared["ratios"]["blocklab"]["b"] = ratio(1.02, 1.005, 1.03)
    compared["floor_seconds_per_round"]["blocklab"] = [2.5, 2.5, 2.5]  # b's step is 0.80-0.88 of it
    (v,) = verdicts(compared, lean)
    assert v["fastest_peer"] == "b" and v["verdict"] == MET
    assert v["at_floor"]["median"] == pytest.approx(0.84) and v["at_floor"]["verdict"] == NOT_MET


def test_a_variant_is_one_table_entry() -> None:
    rms = Variant("blocklab-rms", {"norm": "rms"}, "pre-norm, RMSNorm", Target(speed=1.0, floats_per_d=9.05))
    candidates, _ = build_candidates(TINY, peers=("torch-pre",), variants=(VARIANTS[0], rms))
    assert [c.name for c in candidates] == ["blocklab", "blocklab-rms", "torch-pre"]  # no causal peer
    candidates, _ = build_candidates(TINY, peers=("torch-pre", "hf-gpt2"), variants=(VARIANTS[0], rms))
    assert [c.name for c in candidates] == [
        "blocklab", "blocklab-rms", "blocklab-causal", "blocklab-rms-causal", "torch-pre", "hf-gpt2",
    ]
    result = compare(TINY, rounds=2, peers=("torch-pre",), variants=(VARIANTS[0], rms))
    assert set(result["ratios"]) == {"blocklab", "blocklab-rms"}
    assert set(result["ratios"]["blocklab-rms"]) == {"blocklab", "torch-pre"}
    assert [v["variant"] for v in verdicts(result, (VARIANTS[0], rms))] == ["blocklab", "blocklab-rms"]


def test_a_gated_variant_is_credited_its_third_matmul() -> None:
    swiglu = Variant("blocklab-swiglu", {"activation": "swiglu"}, "pre-norm, SwiGLU")
    result = compare(TINY, rounds=2, peers=(), variants=(swiglu,), memory=False)
    seconds, d, d_ff, tokens = result["seconds_per_round"], TINY.d_model, TINY.d_ff, TINY.tokens
    linear = 3 * tokens * 2 * (4 * d * d + 3 * d * d_ff)  # W1, W3 and W2: three d x d_ff matmuls
    recomputed = 2 * tokens * d * d  # the lean path's residual sum
    probe = 2 * tokens * d * d_ff
    expected = [(linear + recomputed) * m / probe + a
                for m, a in zip(seconds["matmul"], seconds["attention"], strict=True)]
    assert result["floor_seconds_per_round"]["blocklab-swiglu"] == pytest.approx(expected, rel=1e-12)


def test_the_plans_give_enough_rounds_for_a_verdict() -> None:
    assert FULL.rounds >= 20 and QUICK.rounds >= MIN_ROUNDS_FOR_VERDICT  # issue 17: >= 20 interleaved rounds
    with pytest.raises(ValueError, match=r"Plan.rounds=0 must be at least 1"):
        Plan("x", rounds=0, min_seconds=0.0, seqs=(8,), sweep_tokens=8, widths=(16,), width_batch=1,
             sweep_rounds=1, sweep_min_seconds=0.0, depths=(1,))


def test_depth_memory_matches_the_hand_count() -> None:
    d, H, tokens = 16, 2, 16
    rows = depth_memory(TINY, (1, 3))
    for row in rows:
        n = row["depth"]
        assert row["plain_held_bytes"] == 4 * tokens * n * (9 * d + H)  # every block keeps 9d + H
        assert row["checkpointed_held_bytes"] == 4 * tokens * n * d  # only the block boundaries


def test_sweep_shapes_and_rows(report, tmp_path) -> None:
    seqs = seq_shapes(TINY, (4, 8, 32), tokens=16)
    assert [(s.seq, s.batch) for s in seqs] == [(4, 4), (8, 2), (32, 1)]
    widths = width_shapes(TINY, (32, 128))
    assert [(s.d_model, s.n_heads, s.d_ff) for s in widths] == [(32, 1, 128), (128, 2, 512)]
    rows = report["sweep_seq"]  # the tiny plan's seq sweep: seqs[:2]
    assert [(r["seq"], r["batch"]) for r in rows] == [(4, 4), (8, 2)]
    assert all(r["blocklab_us_per_token"] > 0 and r["attention_us_per_token"] > 0 for r in rows)
    assert rows[0]["attention_flop_share"] == 4 * 4 / (8 * 16 + 4 * 64 + 4 * 4)
    path = tmp_path / "sweep.png"
    plot_sweeps(report, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--dtype", "float16", "--dtype: unknown value 'float16'; did you mean bfloat16? (choose from float32, "
                           "bfloat16)"),
    ("--rounds", "0", "--rounds: '0' must be an integer >= 1"),
    ("--rounds", "many", "--rounds: 'many' is not an integer"),
])
def test_cli_bench_rejects_a_bad_value(capsys, flag, value, message) -> None:
    assert main(["bench", flag, value]) == 2
    assert message in capsys.readouterr().err


def test_cli_bench_writes_only_the_files_it_was_named(report, tmp_path, monkeypatch, capsys) -> None:
    """Issue 30, D3: no plot beside --json FILE (it replaced the user's results.png); --plot FILE only."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "results.png").write_bytes(b"their plot")
    asked: list[object] = []

    def fake_bench(**kwargs: object) -> dict:
        asked.append(kwargs["plot"])
        if kwargs["plot"]:
            plot_sweeps(report, str(kwargs["plot"]))
        return report

    monkeypatch.setattr("blocklab.bench.runner.run_bench", fake_bench)
    assert main(["bench", "--quick", "--rounds", "1", "--json", str(theirs / "results.json")]) == 0
    assert asked == [None] and (theirs / "results.png").read_bytes() == b"their plot"
    assert json.loads((theirs / "results.json").read_text()).keys() == report.keys()
    mine = tmp_path / "mine.png"
    assert main(["bench", "--quick", "--json", "-", "--plot", str(mine)]) == 0
    assert asked[-1] == str(mine) and mine.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
