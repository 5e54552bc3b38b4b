"""The benchmark scripts: the machinery their printed ratios rest on, and that each still runs (no
timing is asserted here)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blocklab as bl
from blocklab.nn.hooks import HookPoint

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fields", [
    {"norm_position": "pre", "fused": True}, {"norm_position": "post", "fused": True},
    {"norm_position": "pre", "fused": False}, {"norm_position": "sandwich"},
])
@pytest.mark.parametrize("grad", [False, True])
def test_hooks_overhead_peer_touches_no_hook_point_and_agrees(fields, grad, monkeypatch) -> None:
    """benchmarks/hooks_overhead.py's peer: the same model whose forward never reaches a hook point
    (counted by wrapping every HookPoint entry), giving the hooked model's output exactly."""
    hooks_overhead = _load("hooks_overhead")
    config = bl.ModelConfig(vocab_size=20, max_seq_len=8, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                            activation="gelu", **fields)
    torch.manual_seed(0)
    model = bl.Transformer(config).train(grad)
    plain = hooks_overhead.without_hooks(model)
    tokens = torch.randint(0, 20, (2, 8))
    calls = {"n": 0}
    for name in ("__call__", "see", "observe"):
        original = getattr(HookPoint, name)

        def counted(*args, _original=original, **kwargs):
            calls["n"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(HookPoint, name, counted)
    with torch.set_grad_enabled(grad):
        expected = model(tokens)
        hooked_calls = calls["n"]
        calls["n"] = 0
        got = plain(tokens)
    assert hooked_calls > 0 and calls["n"] == 0
    assert torch.equal(got, expected)
    assert model.blocks[0].uses_lean_path == plain.blocks[0].uses_lean_path  # the same wiring ran


# Each script at its smallest setting: it must still run and print its verdict line. They are not
# imported by the library, so nothing else would notice when a change breaks one (hooks_overhead.py
# did break so). The numbers are not checked here: the records under benchmarks/results/ are.
SMOKE_RUNS = [
    ("block_step.py --rounds 1", "torch-pre"),
    ("cache_memory.py --shape 1,32,2,50 --batch 1 --seq 4 --processes 1",
     "kept by the cache"),
    ("explore_latency.py --rounds 2 --models listops-seed", "a keystroke"),
    ("fused_by_shape.py --rounds 1", "load average"),
    ("norm_cost.py --rounds 1 --widths 64 --dtypes bfloat16 --tokens 64 --layers 1 --step-rounds 1",
     "a whole training step"),
    ("generate.py --tiny --batches 2 --prompt 4 --new 4 --repeats 1 --ragged", "x  True"),
    ("hooks_overhead.py --rounds 1", "of the forward"),
    ("optimizer_bits.py --steps 2", "fused"),
    ("startup.py --rounds 1", "blocklab --version"),
    ("page_faults.py --processes 1 --rounds 1 --peers torch-pre", "page faults / step"),
    ("steps_to_target.py --models post2 --designs gpt-init+sin --seeds 0 --jobs 1 --plain "
     "--train steps=20,eval_every=10", "plain  nn.TransformerEncoder  reached"),
    ("time_to_target.py --seeds 0", "blocklab time / plain time"),
    ("time_to_target.py --costs --steps 3", "blocklab train (diagnostics, report, bar)"),
    ("train_loop.py --steps 3 --rounds 1", "blocklab.training.loop time / plain loop time"),
    ("train_step.py --layers 1 --vocab 256 --batch 1 --seq 16 --rounds 1", "speed-up: the peer's step time"),
]
# Scripts CI runs itself, in the mode named (not again here): the line .ci/run holds for each.
RUN_BY_CI = {"gpu_check.py": "bash scripts/gpu-check.sh --device cpu --quick"}


@pytest.mark.parametrize(("command", "expected"), SMOKE_RUNS, ids=[c for c, _ in SMOKE_RUNS])
def test_every_benchmark_script_still_runs(command, expected, tmp_path) -> None:
    script, *args = command.split()
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}  # beside other tests
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert expected in done.stdout


def test_every_benchmark_script_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts == {command.split()[0] for command, _ in SMOKE_RUNS} | set(RUN_BY_CI)
    ci = (BENCHMARKS.parent / ".ci" / "run").read_text()
    assert all(line in ci for line in RUN_BY_CI.values())


@pytest.mark.parametrize("device", ["foo", "mps", "cuda:x"])
def test_the_gpu_check_refuses_a_device_it_cannot_run_on_in_one_line(device, tmp_path) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--device", device,
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and device in done.stderr
    assert not (tmp_path / "out").exists()  # nothing written
