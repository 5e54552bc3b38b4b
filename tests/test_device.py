"""Tests for blocklab.device and the device / precision paths: device and dtype resolution and
their one-line refusals, the lean kernels under autocast against PyTorch's module path, mixed
precision training and resuming on the CPU, the process-group backend, and the GPU paths (they
skip cleanly on a machine without CUDA or MPS).

This CPU has no native bfloat16 (a bfloat16 matmul is tens of times slower than float32), so every
mixed-precision test here runs a tiny shape.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from processes import failure_text

import blocklab as bl
import blocklab.device as device_module
from blocklab.cli import main
from blocklab.device import (
    Compute,
    DeviceError,
    autocast_problem,
    model_device,
    resolve_compute,
    resolve_device,
    same_rng,
    slow_dtype_warning,
)
from blocklab.errors import BlocklabWarning
from blocklab.nn.model import Transformer
from blocklab.tasks import get_task
from blocklab.training.checkpoint import load_checkpoint
from blocklab.training.distributed import Processes, backend_for
from blocklab.training.loop import TrainConfig, TrainingInterrupted, train
from blocklab.training.runfiles import read_metrics

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU on this machine")
needs_mps = pytest.mark.skipif(not HAS_MPS, reason="no Apple MPS device on this machine")

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
RUN = TrainConfig(steps=6, batch_size=8, warmup=2, log_every=1, eval_every=1000, checkpoint_every=100,
                  target_accuracy=None, eval_batch_size=64)
# bfloat16 keeps 8 bits of mantissa (relative rounding 2**-8 = 0.4%): a tiny model's logits and
# gradients under bfloat16 autocast stay within this relative distance of float32's (measured ~0.3-0.5%)
BF16_REL = 2e-2
# float16 keeps 11 bits (2**-11 = 0.05%)
FP16_REL = 4e-3


def tiny_lm(**changes: object) -> tuple[bl.ModelConfig, object]:
    task = get_task("tiny-lm")
    return bl.preset("tiny-lm", **task.config_overrides(), **{**TINY, **changes}), task


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """|a - b| / |b| over all tensors together (b the reference)."""
    flat_a, flat_b = (torch.cat([d[k].double().flatten() for k in b]) for d in (a, b))
    return float((flat_a - flat_b).norm() / flat_b.norm())


# ---- device and dtype resolution ---------------------------------------------------------------


def test_cpu_and_auto_resolve_and_absent_devices_are_refused_in_one_line() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if HAS_CUDA else ("mps" if HAS_MPS else "cpu")
    assert resolve_device("auto").type == expected
    if not HAS_CUDA:
        with pytest.raises(DeviceError, match=r"^device 'cuda' is not available: .*; available here: cpu"):
            resolve_device("cuda")
        with pytest.raises(DeviceError, match=r"^device 'cuda:1' is not available"):
            resolve_device("cuda:1")
    if not HAS_MPS:
        with pytest.raises(DeviceError, match=r"^device 'mps' is not available: "):
            resolve_device("mps")
    with pytest.raises(DeviceError, match=r"device 'tpu' is not one of: auto, cpu, cuda, mps, cuda:N"):
        resolve_device("tpu")
    with pytest.raises(DeviceError, match=r"dtype 'float8' is not one of: float32, bfloat16, float16"):
        resolve_compute("cpu", "float8")


def test_train_config_names_the_device_and_dtype_fields() -> None:
    with pytest.raises(ValueError, match=r"device.*'gpu'.*auto, cpu, cuda, mps, cuda:N"):
        TrainConfig(device="gpu")
    with pytest.raises(ValueError, match=r"dtype.*'half'.*float32, bfloat16, float16"):
        TrainConfig(dtype="half")


def test_a_dtype_autocast_would_silently_ignore_is_reported() -> None:
    # CPU autocast supports bfloat16 and float16; for float64 torch warns and runs float32 instead
    assert autocast_problem("cpu", torch.bfloat16) is None
    assert autocast_problem("cpu", torch.float16) is None
    problem = autocast_problem("cpu", torch.float64)
    assert problem is not None and problem.startswith("autocast on cpu leaves matmuls in torch.float32")


def test_the_slow_dtype_warning_follows_the_measured_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    rates = {torch.float32: 60.0, torch.bfloat16: 0.5}
    monkeypatch.setattr(device_module, "matmul_rate", lambda dtype: rates[dtype])
    message = slow_dtype_warning(cpu, torch.bfloat16)
    assert message == (
        "this CPU has no native bfloat16: a bfloat16 matmul runs at 0.5 GFLOP/s, float32 at "
        "60 GFLOP/s (measured now), so --dtype bfloat16 computes more slowly than float32 here")
    with pytest.warns(BlocklabWarning, match="no native bfloat16"):
        assert resolve_compute("cpu", "bfloat16") == Compute(cpu, torch.bfloat16)
    rates[torch.bfloat16] = 100.0  # a CPU with native bfloat16 (AMX, recent Arm) gets no warning
    assert slow_dtype_warning(cpu, torch.bfloat16) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_compute("cpu", "float32") == Compute(cpu, torch.float32)
    assert slow_dtype_warning(torch.device("cuda"), torch.bfloat16) is None  # the probe is for CPUs


def test_the_cli_refuses_an_absent_device_and_an_unknown_dtype_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    flags = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32", "--steps", "1", "-q",
             "--no-report", "--out", str(tmp_path / "run")]
    if not HAS_CUDA:
        assert main(["train", *flags, "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("blocklab: error: device 'cuda' is not available: ")
        assert err.count("\n") == 1
        assert not (tmp_path / "run").exists()  # refused before anything is written
    assert main(["train", *flags, "--dtype", "float8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocklab: error: ") and "dtype" in err and "float8" in err and err.count("\n") == 1


def test_the_cli_prints_the_slow_dtype_warning_as_one_line(tmp_path: Path) -> None:
    rates = device_module.matmul_rate(torch.bfloat16), device_module.matmul_rate(torch.float32)
    run = subprocess.run(
        [sys.executable, "-m", "blocklab", "train", "--task", "tiny-lm", "--d-model", "16", "--n-heads", "2",
         "--n-layers", "1", "--d-ff", "32", "--steps", "1", "--warmup", "0", "--batch-size", "4",
         "--device", "cpu",
         "--dtype", "bfloat16", "-q", "--no-report", "--json", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    warned = [line for line in run.stderr.splitlines() if line.startswith("blocklab: warning: ")]
    if rates[0] < device_module.SLOW_SHARE * rates[1]:  # this CPU emulates bfloat16 (the project machine)
        assert len(warned) == 1 and "no native bfloat16" in warned[0]
    assert run.stderr.count("\n") == len(warned)


# ---- the lean kernels under autocast -----------------------------------------------------------


def _loss_and_grads(config: bl.ModelConfig, compute: Compute, x: torch.Tensor, y: torch.Tensor
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Transformer(config).to(compute.device)
    with compute.autocast():
        logits, loss = model(x.to(compute.device), y.to(compute.device))
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay float32
    assert all(g.dtype == torch.float32 for g in grads.values())
    return logits.detach().float().cpu(), grads


def _lean_against_modules(device: torch.device, dtype: torch.dtype, norm_position: str, activation: str,
                          norm: str, tolerance: float) -> None:
    """The lean path under autocast against (1) PyTorch's module path under the same autocast and
    (2) the module path in float32: logits and every parameter's gradient."""
    shape = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, vocab_size=11, max_seq_len=8)
    config = dict(**shape, norm_position=norm_position, activation=activation, norm=norm)
    lean, modules = bl.ModelConfig(**config, fused=True), bl.ModelConfig(**config, fused=False)
    assert lean.uses_lean_path and not modules.uses_lean_path
    generator = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, 11, (2, 8), generator=generator) for _ in range(2))
    mixed = Compute(device, dtype)
    lean_logits, lean_grads = _loss_and_grads(lean, mixed, x, y)
    module_logits, module_grads = _loss_and_grads(modules, mixed, x, y)
    full_logits, full_grads = _loss_and_grads(modules, Compute(torch.device("cpu")), x, y)
    assert lean_grads.keys() == module_grads.keys() == full_grads.keys()
    # the same autocast: the same roundings but in another order (measured <= 1e-5 on the CPU)
    assert relative(lean_grads, module_grads) < tolerance / 10
    assert relative({"l": lean_logits}, {"l": module_logits}) < tolerance / 10
    # against float32: within the dtype's rounding, and not equal (autocast really ran)
    assert 0 < relative(lean_grads, full_grads) < tolerance
    assert 0 < relative({"l": lean_logits}, {"l": full_logits}) < tolerance


@pytest.mark.parametrize(
    ("norm_position", "activation", "norm"),
    [("pre", "gelu", "standard"), ("post", "gelu", "rms"), ("pre", "swiglu", "rms"),
     ("post", "swiglu", "standard")],
)
def test_lean_kernels_under_cpu_bfloat16_autocast_match_the_module_path(
    norm_position: str, activation: str, norm: str
) -> None:
    _lean_against_modules(torch.device("cpu"), torch.bfloat16, norm_position, activation, norm, BF16_REL)


def test_lean_kernels_under_cpu_float16_autocast_match_the_module_path() -> None:
    _lean_against_modules(torch.device("cpu"), torch.float16, "pre", "gelu", "standard", FP16_REL)


def test_float32_and_float64_lean_paths_agree() -> None:
    config = bl.ModelConfig(d_model=16, n_heads=2, n_layers=2, d_ff=32, vocab_size=11, max_seq_len=8,
                            fused=True)
    generator = torch.Generator().manual_seed(2)
    x, y = (torch.randint(0, 11, (2, 8), generator=generator) for _ in range(2))
    results = []
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        model = Transformer(config).to(dtype)
        logits, loss = model(x, y)
        loss.backward()
        results.append(({"l": logits.detach()}, {n: p.grad for n, p in model.named_parameters()}))
    assert relative(results[0][0], results[1][0]) < 1e-6
    assert relative(results[0][1], results[1][1]) < 1e-5


# ---- training in mixed precision on the CPU -------------------------------------------------------


def test_a_bfloat16_autocast_run_trains_and_resumes_bit_for_bit(tmp_path: Path, ctrl_c) -> None:
    config, task = tiny_lm(fused=True)
    mixed = RUN.replace(device="cpu", dtype="bfloat16")
    with pytest.raises(TrainingInterrupted):
        train(config, mixed, task, tmp_path / "run", callbacks=[ctrl_c(3)], report=False)
    resumed = train(config, mixed, task, tmp_path / "run", resume=True, report=False)
    plain = train(config, mixed, task)
    full = train(config, RUN.replace(device="cpu"), task)
    mixed_losses = [r["loss"] for r in plain.history]
    assert resumed.step == 6 and [r["loss"] for r in read_metrics(tmp_path / "run")] == mixed_losses
    full_losses = [r["loss"] for r in full.history]
    assert mixed_losses != full_losses and mixed_losses == pytest.approx(full_losses, rel=BF16_REL)
    assert mixed_losses[-1] < mixed_losses[0]  # it trains
    assert all(p.dtype == torch.float32 for p in plain.model.parameters())


def test_a_float16_run_scales_its_loss_and_follows_float32(tmp_path: Path) -> None:
    config, task = tiny_lm()
    half = train(config, RUN.replace(device="cpu", dtype="float16"), task)
    full = train(config, RUN.replace(device="cpu"), task)
    assert [r["grad_scale"] for r in half.history] == [2.0**16] * 6  # GradScaler's initial scale, no overflow
    assert "grad_scale" not in full.history[0]
    half_losses, full_losses = [r["loss"] for r in half.history], [r["loss"] for r in full.history]
    assert half_losses != full_losses and half_losses == pytest.approx(full_losses, rel=FP16_REL)


def test_dtype_cannot_change_on_resume_but_device_can(tmp_path: Path) -> None:
    config, task = tiny_lm()
    train(config, RUN.replace(steps=2, device="cpu"), task, tmp_path / "run", report=False)
    with pytest.raises(ValueError, match=r"'dtype': 'float32'.*'dtype': 'bfloat16'"):
        train(config, RUN.replace(steps=3, device="cpu", dtype="bfloat16"), task, tmp_path / "run",
              resume=True, report=False)
    again = train(config, RUN.replace(steps=3, device="auto"), task, tmp_path / "run", resume=True,
                  report=False)
    assert again.step == 3


# ---- the other commands: eval, predict, generate, trace ---------------------------------------------


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("device") / "run"
    config, task = tiny_lm()
    train(config, RUN.replace(steps=20, device="cpu"), task, out, report=False)
    return out


def _json_out(argv: list[str], capsys: pytest.CaptureFixture) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_and_predict_take_device_and_dtype(lm_run: Path, capsys: pytest.CaptureFixture) -> None:
    full = _json_out(["eval", "--checkpoint", str(lm_run), "--json", "--device", "cpu"], capsys)
    half = _json_out(
        ["eval", "--checkpoint", str(lm_run), "--json", "--device", "cpu", "--dtype", "bfloat16"], capsys)
    assert half["loss"] != full["loss"] and half["loss"] == pytest.approx(full["loss"], rel=BF16_REL)
    query = ["predict", "--checkpoint", str(lm_run), "--input", "<BOS> I like", "--json",
             "--device", "cpu"]
    answers = [_json_out([*query, "--dtype", dtype], capsys) for dtype in ("float32", "bfloat16")]
    assert answers[0]["answer"] == answers[1]["answer"]
    assert answers[1]["probability"] == pytest.approx(answers[0]["probability"], rel=BF16_REL)
    if not HAS_CUDA:
        assert main(["eval", "--checkpoint", str(lm_run), "--device", "cuda"]) == 2
        assert capsys.readouterr().err.startswith("blocklab: error: device 'cuda' is not available")


def test_generate_under_bfloat16_equals_a_greedy_loop_under_the_same_autocast(
    lm_run: Path, capsys: pytest.CaptureFixture
) -> None:
    prompt, weights = [1, 3], lm_run / "checkpoints" / "step-000020" / "model.safetensors"
    out = _json_out(["generate", "--checkpoint", str(weights), "--input", "1 3", "--ids", "--max-new-tokens",
                     "2", "--json", "--device", "cpu", "--dtype", "bfloat16"], capsys)
    model = load_checkpoint(weights).model.eval()
    seq = torch.tensor([prompt])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # no KV cache: the whole sequence
        for _ in range(2):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out["new_ids"] == seq[0, 2:].tolist()


def test_trace_under_bfloat16_rounds_the_stages_and_reads_them_in_full_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    def numbers(values: object) -> object:
        if isinstance(values, list):
            return [numbers(v) for v in values]
        return math.nan if values is None else values

    traced = {}
    for dtype in ("float32", "bfloat16"):
        argv = ["trace", "--preset", "tiny-lm", "--input", "I like", "--stages", "blocks.0.*", "-q",
                "--json", str(tmp_path / f"{dtype}.json"), "--device", "cpu", "--dtype", dtype]
        assert main(argv) == 0
        traced[dtype] = {s["name"]: s for s in json.loads((tmp_path / f"{dtype}.json").read_text())["stages"]}
    capsys.readouterr()
    assert traced["float32"].keys() == traced["bfloat16"].keys()
    for name, stage in traced["float32"].items():
        full = torch.tensor(numbers(stage["values"]), dtype=torch.float64)  # masked scores (null) are NaN
        half = torch.tensor(numbers(traced["bfloat16"][name]["values"]), dtype=torch.float64)
        assert torch.equal(full.isnan(), half.isnan()), name
        full, half = full.nan_to_num(0.0), half.nan_to_num(0.0)
        assert float((half - full).norm() / full.norm()) < BF16_REL, name
    ffn = traced["bfloat16"]["blocks.0.ffn.out"]
    assert ffn["values"] != traced["float32"]["blocks.0.ffn.out"]["values"]  # autocast ran


# ---- pieces ---------------------------------------------------------------------------------------


def test_the_backend_is_nccl_for_cuda_and_gloo_otherwise() -> None:
    assert backend_for(torch.device("cuda", 0)) == "nccl"
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("mps")) == "gloo"
    single = Processes.from_env(torch.device("cpu"))
    assert (single.world_size, single.device, single.sum(2.5)) == (1, torch.device("cpu"), 2.5)


def test_same_rng_puts_the_generator_back() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with same_rng(torch.device("cpu")):
        torch.rand(100)
    assert torch.equal(torch.rand(3), expected)
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")


# ---- GPUs: present here as tests, skipped without the hardware --------------------------------------


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lean_kernels_under_cuda_autocast_match_the_module_path(dtype: torch.dtype) -> None:
    tolerance = BF16_REL if dtype == torch.bfloat16 else FP16_REL
    for norm_position, activation in (("pre", "gelu"), ("post", "swiglu")):
        _lean_against_modules(torch.device("cuda"), dtype, norm_position, activation, "standard", tolerance)


@needs_cuda
@pytest.mark.parametrize(("dtype", "tolerance"),
                         [("float32", 1e-4), ("bfloat16", BF16_REL), ("float16", FP16_REL)])
def test_training_on_cuda_follows_the_cpu_run(tmp_path: Path, dtype: str, tolerance: float) -> None:
    config, task = tiny_lm(fused=True)
    gpu = train(config, RUN.replace(device="cuda", dtype=dtype), task, tmp_path / "run", report=False)
    cpu = train(config, RUN.replace(device="cpu"), task)
    assert model_device(gpu.model).type == "cuda"
    assert [r["loss"] for r in gpu.history] == pytest.approx([r["loss"] for r in cpu.history], rel=tolerance)
    resumed = train(config, RUN.replace(steps=8, device="cuda", dtype=dtype), task, tmp_path / "run",
                    resume=True, report=False)
    assert resumed.step == 8


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL data parallelism needs 2 CUDA GPUs")
def test_torchrun_on_two_gpus_uses_nccl_and_matches_one_process(tmp_path: Path) -> None:
    flags = ("--preset tiny-lm --task tiny-lm --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32 --steps 6 "
             "--batch-size 8 --log-every 1 --target-accuracy none -q --no-report --log-diagnostics 0 "
             "--device cuda").split()
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
         "blocklab", "train", *flags, "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert run.returncode == 0, failure_text(run.stderr)
    config, task = tiny_lm()
    single = train(config, TrainConfig(steps=6, batch_size=8, log_every=1, target_accuracy=None,
                                       device="cuda"), task)
    rows = read_metrics(tmp_path / "ddp")
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in single.history], abs=1e-4)


@needs_mps
def test_training_on_mps_follows_the_cpu_run() -> None:
    config, task = tiny_lm()
    mps = train(config, RUN.replace(device="mps"), task)
    cpu = train(config, RUN.replace(device="cpu"), task)
    assert [r["loss"] for r in mps.history] == pytest.approx([r["loss"] for r in cpu.history], rel=1e-4)
