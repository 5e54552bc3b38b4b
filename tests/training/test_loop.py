"""Tests for blocklab.training.loop: schedule, data order, the loop against a plain PyTorch loop,
determinism, callbacks, resume after SIGKILL, torchrun DDP, non-finite stops, locks, CLI."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from processes import failure_text
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

import blocklab as bl
from blocklab.cli import main
from blocklab.files.folders import RunLock, RunLockedError
from blocklab.tasks import TaskData, get_task
from blocklab.training.checkpoint import load_checkpoint
from blocklab.training.loop import (
    TrainConfig,
    TrainingDiverged,
    TrainingInterrupted,
    batch_indices,
    evaluate,
    lr_at,
    task_train_config,
    train,
    train_config_from_dict,
)
from blocklab.training.runfiles import checkpoint_dirs, read_metrics
from blocklab.training.state import load_optimizer_state, save_optimizer_state

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
TINY_FLAGS = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1", "--d-ff", "32"]
QUIET = {"target_accuracy": None, "eval_every": 1000, "checkpoint_every": 0}


def tiny(task_name: str = "listops", **changes: object) -> tuple[bl.ModelConfig, object]:
    task = get_task(task_name)
    return bl.preset("listops-seed", **task.config_overrides(), **{**TINY, **changes}), task


def losses(rows: list[dict]) -> list[float]:
    return [r["loss"] for r in rows]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "blocklab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# ---- schedule, data order, evaluation ----------------------------------------------------------


def test_lr_schedule_equals_torch_linear_then_cosine_schedulers() -> None:
    c = TrainConfig(steps=50, warmup=10, lr=0.01, min_lr_ratio=0.1)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=c.lr)
    warm = LinearLR(opt, start_factor=1 / 10, end_factor=1.0, total_iters=9)
    cosine = CosineAnnealingLR(opt, T_max=50 - 10 - 1, eta_min=0.001)
    sched = SequentialLR(opt, [warm, cosine], milestones=[10])
    expected = []
    for _ in range(50):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    ours = [lr_at(step, c) for step in range(1, 51)]
    torch.testing.assert_close(
        torch.tensor(ours, dtype=torch.float64),
        torch.tensor(expected, dtype=torch.float64),
        rtol=1e-9,
        atol=1e-12,
    )
    assert ours[9] == pytest.approx(0.01) and ours[-1] == pytest.approx(0.001)


def test_batches_visit_every_example_once_per_epoch_in_a_seeded_order() -> None:
    n, b = 10, 4
    stream = torch.cat([batch_indices(step, n, b, seed=3) for step in range(1, 6)]).tolist()  # 2 epochs
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert stream[:10] != stream[10:]
    other = torch.cat([batch_indices(step, n, b, seed=4) for step in range(1, 6)]).tolist()
    assert other != stream


def test_evaluate_equals_cross_entropy_and_a_hand_count_of_exact_matches() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 3, 4, generator=g)
    targets = logits.argmax(-1).clone()
    targets[0, 1] = (targets[0, 1] + 1) % 4  # example 0 wrong at a scored position
    targets[1, 0] = -100
    targets[2, :] = -100  # nothing scored: counts as correct
    targets[3, 2] = (targets[3, 2] + 1) % 4
    targets[3, 1] = -100
    data = TaskData(torch.arange(5)[:, None].repeat(1, 3), targets)  # token 0 of each row = its index

    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return logits[x[:, 0]]

    result = evaluate(Fixed(), data, batch_size=2)
    expected_loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    assert result["loss"] == pytest.approx(float(expected_loss), rel=1e-6)
    assert result["accuracy"] == pytest.approx(3 / 5)  # examples 1, 2, 4 right


# ---- the loop ----------------------------------------------------------------------------------


def test_first_steps_equal_a_plain_pytorch_adamw_loop_with_clipping() -> None:
    config, task = tiny()
    c = TrainConfig(
        steps=4,
        batch_size=8,
        lr=3e-3,
        warmup=0,
        min_lr_ratio=1.0,
        grad_clip=0.05,
        weight_decay=0.1,
        log_every=1,
        seed=5,
        **QUIET,
    )
    result = train(config, c, task)

    torch.manual_seed(5)
    model = bl.Transformer(config)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=3e-3,
        betas=(0.9, 0.98),
    )
    data, expected = task.split("train"), []
    for step in range(1, 5):
        idx = batch_indices(step, len(data), 8, seed=5)
        _, loss = model(data.inputs[idx], data.targets[idx])
        expected.append(loss.item())
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        assert norm > 0.05  # clipping is active in this test
        opt.step()
    assert losses(result.history) == pytest.approx(expected, rel=1e-6, abs=0)
    for (name, ours), theirs in zip(
        result.model.state_dict().items(), model.state_dict().values(), strict=True
    ):
        if name.endswith("attn.k.bias"):
            # softmax is shift-invariant per query, so a key bias gets no gradient but rounding noise
            # (~1e-9), which AdamW's normalisation turns into small steps of either sign: two correct
            # implementations differ there, and both keep it near zero
            assert ours.abs().max() < 1e-3 and theirs.abs().max() < 1e-3, name
            continue
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7, msg=name)


def test_same_seed_repeats_losses_bit_for_bit_and_another_seed_does_not() -> None:
    config, task = tiny(dropout=0.1)
    c = TrainConfig(steps=15, batch_size=16, log_every=1, **QUIET)
    a, b = train(config, c, task), train(config, c, task)
    other = train(config, c.replace(seed=1), task)
    assert losses(a.history) == losses(b.history)  # exact, not approximate
    assert losses(a.history) != losses(other.history)


def test_callbacks_see_the_steps_gradients_cannot_disturb_the_run_and_extend_metrics(tmp_path: Path) -> None:
    config, task = tiny(dropout=0.1)
    c = TrainConfig(steps=6, batch_size=8, log_every=3, seed=2, **QUIET)
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def probe(ctx: object) -> dict | None:
        seen[ctx.step] = {n: p.grad.clone() for n, p in ctx.model.named_parameters()}
        torch.rand(100)  # consumes the global RNG (dropout's) ...
        ctx.model.eval()  # ... and changes the mode: the trainer must undo both
        return {"probe": ctx.step * 10} if ctx.step in (1, 3) else None

    result = train(config, c, task, tmp_path / "run", callbacks=[probe], report=False)
    plain = train(config, c, task)
    assert [r["loss"] for r in result.history if r["step"] in (3, 6)] == losses(plain.history)

    torch.manual_seed(2)  # the oracle: step 1's gradient by hand, from the same init and batch
    model = bl.Transformer(config)
    data = task.split("train")
    idx = batch_indices(1, len(data), 8, seed=2)
    model(data.inputs[idx], data.targets[idx])[1].backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(seen[1][name], p.grad, rtol=1e-5, atol=1e-8, msg=name)  # threads differ
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert rows[1]["probe"] == 10 and rows[3]["probe"] == 30 and "probe" not in rows[6]
    assert sorted(rows) == [1, 3, 6]  # log steps plus the steps a callback added to


def test_tiny_lm_memorises_its_sentence() -> None:
    task = get_task("tiny-lm")
    result = train(bl.preset("tiny-lm", **task.config_overrides()), None, task)
    data = task.split("test")
    with torch.no_grad():
        logits = result.model.eval()(data.inputs)
    loss = F.cross_entropy(logits.flatten(0, 1).double(), data.targets.flatten())
    assert loss < 0.01
    assert task.tokenizer.decode(logits.argmax(-1)[0]) == "I like transformers <EOS>"


@pytest.mark.parametrize("layout", ["parallel", "parallel_shared"])
def test_a_parallel_block_trains_like_the_others(layout: str) -> None:
    """The layouts table's parallel rows train with the same loop: tiny-lm memorised at the defaults."""
    task = get_task("tiny-lm")
    result = train(bl.preset("tiny-lm", norm_position=layout, **task.config_overrides()), None, task)
    data = task.split("test")
    with torch.no_grad():
        logits = result.model.eval()(data.inputs)
    assert F.cross_entropy(logits.flatten(0, 1).double(), data.targets.flatten()) < 0.01


@pytest.mark.parametrize("task_name", ["listops", "tiny-lm"])
def test_the_llama_style_preset_trains_on_listops_and_tiny_lm(task_name: str) -> None:
    """The modern block (RMSNorm, SwiGLU, rotary positions, grouped-query attention) at the listops
    seed's size trains with the same loop and defaults: listops to its target, tiny-lm memorised."""
    task = get_task(task_name)
    result = train(bl.preset("llama-seed", **task.config_overrides()), None, task)
    data = task.split("test")
    with torch.no_grad():
        logits = result.model.eval()(data.inputs)
    scored = data.targets != -100
    accuracy = (logits.argmax(-1)[scored] == data.targets[scored]).double().mean()
    assert accuracy >= 0.99


# ---- run folder: checkpoints, resume, locks, non-finite ----------------------------------------


def test_optimizer_state_round_trip_continues_identically(tmp_path: Path) -> None:
    config, _ = tiny()
    torch.manual_seed(0)
    model = bl.Transformer(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, config.vocab_size, (4, config.max_seq_len))

    def step(m: torch.nn.Module, o: torch.optim.Optimizer) -> None:
        o.zero_grad()
        m(x, x)[1].backward()
        o.step()

    step(model, opt)
    save_optimizer_state(tmp_path / "opt.safetensors", model, opt)
    twin = bl.Transformer(config)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    load_optimizer_state(tmp_path / "opt.safetensors", twin, twin_opt)
    step(model, opt)
    step(twin, twin_opt)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


def test_resume_after_sigkill_reproduces_the_uninterrupted_losses(tmp_path: Path) -> None:
    args = [
        "train",
        *TINY_FLAGS,
        *(
            "--dropout 0.1 --steps 200 --batch-size 16 --log-every 1 --eval-every 100 "
            "--checkpoint-every 20 --target-accuracy none -q --no-report "
            "--log-diagnostics 0"
        ).split(),
    ]
    full = run_cli(*args, "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "blocklab", *args, "--out", str(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-000040").exists() and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps_on_disk = [s for s, _ in checkpoint_dirs(killed)]
    assert steps_on_disk and max(steps_on_disk) < 200, "the run was not interrupted"
    assert (killed / ".lock").exists()  # left behind by the killed process: resume takes it over
    resumed = run_cli(*args, "--out", str(killed), "--resume")  # same flags: agreed with config.json
    assert resumed.returncode == 0, resumed.stderr
    a, b = read_metrics(tmp_path / "full"), read_metrics(killed)
    assert [r["step"] for r in b] == list(range(1, 201))
    assert losses(a) == losses(b)  # bit for bit
    final_a = load_checkpoint(tmp_path / "full" / "checkpoints" / "step-000200" / "model.safetensors")
    final_b = load_checkpoint(killed / "checkpoints" / "step-000200" / "model.safetensors")
    for key, value in final_a.model.state_dict().items():
        assert torch.equal(value, final_b.model.state_dict()[key]), key


def test_torchrun_two_processes_match_one_process(tmp_path: Path) -> None:
    args = [
        "train",
        *TINY_FLAGS,
        *(
            "--steps 12 --batch-size 16 --log-every 1 --eval-every 6 --target-accuracy none "
            "-q --no-report --log-diagnostics 0"
        ).split(),
        "--out",
        str(tmp_path / "ddp"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a child's abort: its stacks
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "blocklab",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert ddp.returncode == 0, failure_text(ddp.stderr)
    config, task = tiny()
    single = train(
        config, TrainConfig(steps=12, batch_size=16, log_every=1, eval_every=6, target_accuracy=None), task
    )
    rows = read_metrics(tmp_path / "ddp")
    assert json.loads((tmp_path / "ddp" / "config.json").read_text())["world_size"] == 2
    assert losses(rows) == pytest.approx(losses(single.history), abs=1e-5, rel=0)
    assert rows[-1]["eval_loss"] == pytest.approx(single.history[-1]["eval_loss"], abs=1e-5)


def test_batch_not_divisible_by_processes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from blocklab.training import distributed

    monkeypatch.setattr(distributed.Processes, "from_env", classmethod(lambda cls, device=None: cls(0, 3)))
    config, task = tiny()
    with pytest.raises(ValueError, match="batch_size=16 must be divisible by the 3 processes"):
        train(config, TrainConfig(steps=1, batch_size=16), task)


def _poison_grad(at: int):
    def callback(ctx: object) -> None:
        if ctx.step == at:
            next(ctx.model.parameters()).grad.fill_(float("nan"))

    return callback


def _poison_weight(at: int):
    def callback(ctx: object) -> None:  # breaks the callback contract on purpose
        if ctx.step == at:
            with torch.no_grad():
                ctx.model.embed.weight.fill_(float("inf"))

    return callback


@pytest.mark.parametrize(
    ("poison", "step", "what"),
    [
        (_poison_grad(8), 8, "the gradient norm is nan"),
        (_poison_weight(7), 8, "the training loss is nan"),
    ],
)
def test_nonfinite_stops_at_the_step_and_keeps_the_good_checkpoint(
    tmp_path: Path, poison: object, step: int, what: str
) -> None:
    config, task = tiny()
    c = TrainConfig(
        steps=20, batch_size=8, log_every=1, checkpoint_every=5, eval_every=100, target_accuracy=None
    )
    with pytest.raises(TrainingDiverged, match=f"step {step}: {what}.*step-000005") as error:
        train(config, c, task, tmp_path, callbacks=[poison], report=False)
    assert "\n" not in str(error.value)
    assert [s for s, _ in checkpoint_dirs(tmp_path)] == [5]
    good = load_checkpoint(tmp_path / "checkpoints" / "step-000005" / "model.safetensors")
    assert all(torch.isfinite(p).all() for p in good.model.parameters())
    assert read_metrics(tmp_path)[-1]["step"] == step  # the bad step is logged for the report


def test_live_lock_refuses_a_second_run_and_a_dead_holders_lock_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from blocklab.files.folders import RunLock; "
            f"RunLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        config, task = tiny()
        with pytest.raises(RunLockedError, match=f"in use by another blocklab run \\(pid {holder.pid} "):
            train(config, TrainConfig(steps=2, batch_size=8), task, tmp_path, report=False)
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == holder.pid  # stale: its process is dead
    result = train(config, TrainConfig(steps=2, batch_size=8, **QUIET), task, tmp_path, report=False)
    assert result.step == 2 and not (tmp_path / ".lock").exists()
    with RunLock(tmp_path), pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
        RunLock(tmp_path).acquire()  # a second lock from the same process is refused too


def test_a_finished_run_folder_needs_resume_or_overwrite(tmp_path: Path) -> None:
    config, task = tiny()
    c = TrainConfig(steps=3, batch_size=8, **QUIET)
    train(config, c, task, tmp_path, report=False)
    with pytest.raises(ValueError, match="already holds a run.*--resume.*--overwrite"):
        train(config, c, task, tmp_path, report=False)
    with pytest.raises(ValueError, match="configured differently"):
        train(config, c.replace(lr=1e-4), task, tmp_path, resume=True, report=False)
    again = train(config, c, task, tmp_path, resume=True, report=False)  # finished: nothing to do
    assert again.step == 3 and len(read_metrics(tmp_path)) == 1
    assert train(config, c, task, tmp_path, overwrite=True, report=False).step == 3


def test_train_config_errors_name_the_field_and_the_rule() -> None:
    with pytest.raises(ValueError, match=r"TrainConfig.lr=-1 must be a number > 0"):
        TrainConfig(lr=-1)
    with pytest.raises(ValueError, match=r"TrainConfig.target_accuracy=1.5 must be a number in \(0, 1\]"):
        TrainConfig(target_accuracy=1.5)
    with pytest.raises(ValueError, match="TrainConfig has no field lrate"):
        train_config_from_dict({"lrate": 1})
    assert task_train_config("tiny-lm", steps=7).target_accuracy is None
    config, task = tiny()
    with pytest.raises(ValueError, match="vocab_size=5 but task 'listops' needs 18"):
        train(config.replace(vocab_size=5), TrainConfig(steps=1), task)


# ---- the commands ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    code = main(
        [
            "train",
            *TINY_FLAGS,
            "--steps",
            "60",
            "--batch-size",
            "32",
            "--eval-every",
            "30",
            "-q",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


def test_eval_command_equals_a_hand_evaluation_of_the_checkpoint(
    trained_run: Path, capsys: pytest.CaptureFixture
) -> None:
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(trained_run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = load_checkpoint(trained_run / "checkpoints" / "step-000060" / "model.safetensors").model.eval()
    test = get_task("listops").split("test")
    with torch.no_grad():
        logits = model(test.inputs)
    answer = test.targets[:, 7]
    assert out["examples"] == 400
    assert out["accuracy"] == pytest.approx(float((logits[:, 7].argmax(-1) == answer).double().mean()))
    assert out["loss"] == pytest.approx(float(F.cross_entropy(logits[:, 7].double(), answer)), rel=1e-5)


def test_predict_command_prints_the_argmax_answer_and_its_probability(
    trained_run: Path, capsys: pytest.CaptureFixture
) -> None:
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(trained_run), "--input", "Max ( 3 , 9 , 4 )", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    model = load_checkpoint(trained_run / "checkpoints" / "step-000060" / "model.safetensors").model.eval()
    vocab = ["<PAD>", *"0123456789", "Max", "Min", "First", "Last", "(", ")", ","]
    ids = [vocab.index(t) for t in "Max ( 3 , 9 , 4 )".split()]
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([ids]))[0, 7], -1)
    assert out["answer"] == vocab[int(probs.argmax())]
    assert out["probability"] == pytest.approx(float(probs.max()), rel=1e-5)
    assert main(["predict", "--checkpoint", str(trained_run), "--input", "Max ( 3 , 9 )"]) == 2
    assert "listops input is 8 space-separated tokens" in capsys.readouterr().err


def test_resume_flags_must_agree_with_config_json(trained_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--out", str(trained_run), "--resume", "--lr", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--lr 0.1 (the run has 0.005)" in err and err.count("\n") == 1


def _held_out_accuracy(run: Path) -> float:
    """Exact match of the run's last checkpoint on its listops test split, counted here."""
    ckpt = sorted((run / "checkpoints").iterdir())[-1] / "model.safetensors"
    model = load_checkpoint(ckpt).model.eval()
    test = get_task("listops").split("test")
    with torch.no_grad():
        predicted = model(test.inputs)[:, 7].argmax(-1)
    return float((predicted == test.targets[:, 7]).double().mean())


def test_default_train_command_reaches_99_percent_held_out(tmp_path: Path) -> None:
    """The README's main command, as is: listops, listops-seed, default TrainConfig."""
    assert main(["train", "-q", "--out", str(tmp_path)]) == 0
    assert _held_out_accuracy(tmp_path) >= 0.99


def test_pre_norm_six_layers_reaches_99_percent_with_the_cli_defaults(tmp_path: Path) -> None:
    """Issue 13: with the default input embedding, depth and pre-norm train like the default model.
    In the default suite: it stops at its target in about 8 s on 2 cores (issue 13 asks for the slow
    marker only past a minute)."""
    assert main(["train", "-q", "--no-report", "--norm-position", "pre", "--n-layers", "6",
                 "--out", str(tmp_path)]) == 0
    assert _held_out_accuracy(tmp_path) >= 0.99


def test_pre_norm_three_narrow_layers_reach_99_percent_with_the_cli_defaults(tmp_path: Path) -> None:
    """The fast version of the test above: pre-norm, 3 layers of d_model 32, every other flag default."""
    assert main(["train", "-q", "--no-report", "--norm-position", "pre", "--n-layers", "3", "--d-model", "32",
                 "--d-ff", "128", "--out", str(tmp_path)]) == 0
    assert _held_out_accuracy(tmp_path) >= 0.99


def test_predict_without_a_recorded_task_gives_the_next_token(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from blocklab.training.checkpoint import save_checkpoint

    task = get_task("tiny-lm")
    config = bl.preset("tiny-lm", **task.config_overrides())
    torch.manual_seed(3)
    model = bl.Transformer(config).eval()
    save_checkpoint(tmp_path / "m.safetensors", model, tokenizer=task.tokenizer.to_dict())  # no task in meta
    capsys.readouterr()
    assert (
        main(["predict", "--checkpoint", str(tmp_path / "m.safetensors"), "--input", "<BOS> I", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([[1, 3]]))[0, -1], -1)  # <BOS>=1, I=3
    assert out["answer"] == task.tokenizer.vocab[int(probs.argmax())]
    assert out["probability"] == pytest.approx(float(probs.max()), rel=1e-5)


# ---- resume: extending a run, edited files, Ctrl-C, a full disk (issue 12, issue 15 item 5) ---------


def _cosine(step: int, c: TrainConfig) -> float:
    """The schedule written out (the oracle for lr_at): linear warmup, then cosine to lr * min_lr_ratio."""
    if step <= c.warmup:
        return c.lr * step / c.warmup
    t = (step - c.warmup - 1) / (c.steps - c.warmup - 1)
    return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * (1 + math.cos(math.pi * t)) / 2)


EXTEND = TrainConfig(steps=6, batch_size=8, warmup=2, log_every=1, eval_every=1000, checkpoint_every=3,
                     target_accuracy=None)


def test_resume_with_more_steps_extends_a_finished_run_on_the_recomputed_cosine(tmp_path: Path) -> None:
    config, task = tiny("tiny-lm")
    first = train(config, EXTEND, task, tmp_path, report=False)
    before = read_metrics(tmp_path)
    longer = EXTEND.replace(steps=10)
    result = train(config, longer, task, tmp_path, resume=True, report=False)
    assert (first.step, result.step, result.resumed_step) == (6, 10, 6)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 11)) and rows[:6] == before
    for r in rows[6:]:  # steps 7..10 follow the 10-step cosine, recomputed from the resumed step on
        assert r["lr"] == pytest.approx(_cosine(r["step"], longer), rel=1e-12)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["train"]["steps"] == 10
    assert saved["extended"] == [{"at_step": 6, "steps_before": 6, "steps": 10}]
    again = train(config, longer, task, tmp_path, resume=True, report=False)  # finished: nothing to do
    assert again.step == again.resumed_step == 10 and len(read_metrics(tmp_path)) == 10
    with pytest.raises(ValueError, match="is at step 10; steps=8 would undo training, so it must be >= 10"):
        train(config, EXTEND.replace(steps=8), task, tmp_path, resume=True, report=False)
    with pytest.raises(ValueError, match="configured differently"):
        train(config, longer.replace(lr=1e-4), task, tmp_path, resume=True, report=False)


def test_an_extension_from_a_stopped_run_equals_the_same_extension_of_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    """Extending is resuming: killed at step 3 of 6 then extended to 10 gives the losses of 6 extended to 10
    for every step after 3 the two share a learning rate (the schedule is a function of the total)."""
    config, task = tiny("tiny-lm", dropout=0.1)
    longer = EXTEND.replace(steps=10)
    train(config, EXTEND, task, tmp_path / "a", report=False)
    extended = train(config, longer, task, tmp_path / "a", resume=True, report=False)
    train(config, EXTEND.replace(steps=3), task, tmp_path / "b", report=False)  # "stopped" at 3
    early = train(config, longer, task, tmp_path / "b", resume=True, report=False)
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert losses(a[:4]) == losses(b[:4])  # steps 1-3 identical, and step 4's batch before any update differs
    fresh = train(config, longer, task)  # a 10-step run from the start: b's steps 4..10 have its schedule
    assert [r["lr"] for r in b[3:]] == [r["lr"] for r in fresh.history[3:]]
    assert extended.step == early.step == 10


def test_raised_steps_in_config_json_train_on_instead_of_reporting_all_steps_done(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    flags = [*TINY_FLAGS, "--task", "tiny-lm", "--steps", "4", "--batch-size", "8", "--eval-every", "2", "-q",
             "--no-report", "--log-diagnostics", "0", "--out", str(out)]
    assert main(["train", *flags]) == 0
    saved = json.loads((out / "config.json").read_text())
    saved["train"]["steps"] = 8  # the reproduction: raise steps in config.json, then --resume
    (out / "config.json").write_text(json.dumps(saved))
    assert main(["train", "--resume", "--out", str(out), "-q", "--no-report", "--log-diagnostics", "0"]) == 0
    assert "at step 8 of 8" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(out) if "eval_accuracy" in r] == [2, 4, 6, 8]


def test_cli_resume_with_steps_extends_and_says_when_there_is_nothing_to_train(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    quiet = ["-q", "--no-report", "--log-diagnostics", "0"]
    flags = [*TINY_FLAGS, "--task", "tiny-lm", "--steps", "4", "--batch-size", "8", "--eval-every", "2",
             *quiet]
    assert main(["train", *flags, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(out), *quiet]) == 0
    printed = capsys.readouterr().out
    assert "at step 4 of 4 (all steps done before: nothing to train; pass --steps N (N > 4) to" in printed
    assert main(["train", "--resume", "--steps", "6", "--out", str(out), *quiet]) == 0
    assert "at step 6 of 6 (all steps done)" in capsys.readouterr().out
    assert main(["train", "--resume", "--steps", "8", "--lr", "0.1", "--out", str(out), *quiet]) == 2
    assert "--lr 0.1 (the run has 0.005)" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["extended"] == [
        {"at_step": 4, "steps_before": 4, "steps": 6}]


def test_a_run_stopped_at_its_target_extends_only_when_the_target_changes(tmp_path: Path) -> None:
    config, task = tiny("tiny-lm")
    c = EXTEND.replace(steps=400, lr=1e-2, eval_every=5, checkpoint_every=0, target_accuracy=0.5)
    first = train(config, c, task, tmp_path, report=False)
    assert first.stopped == "target" and first.step < 400
    same = train(config, c.replace(steps=600), task, tmp_path, resume=True, report=False)
    assert (same.step, same.stopped) == (first.step, "target")  # still at its target: nothing to train
    on = train(config, c.replace(steps=first.step + 5, target_accuracy=None), task, tmp_path, resume=True,
               report=False)
    assert (on.step, on.stopped) == (first.step + 5, "steps")


def test_an_edited_state_json_or_config_json_is_refused(tmp_path: Path) -> None:
    config, task = tiny("tiny-lm")
    train(config, EXTEND, task, tmp_path, report=False)
    state_file = tmp_path / "checkpoints" / "step-000006" / "state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "step": 3}))  # "edited from 80 to 10"
    with pytest.raises(ValueError, match="state.json: does not match the digest .* records"):
        train(config, EXTEND, task, tmp_path, resume=True, report=False)
    state_file.write_text(json.dumps(state, indent=2) + "\n")
    run_config = json.loads((tmp_path / "config.json").read_text())
    edited = {**run_config, "train": {**run_config["train"], "lr": 1}}
    (tmp_path / "config.json").write_text(json.dumps(edited))
    with pytest.raises(ValueError, match="with lr=0.005 but the run now says lr=1 .config.json edited"):
        train(config, EXTEND.replace(lr=1), task, tmp_path, resume=True, report=False)


def test_ctrl_c_checkpoints_the_interrupted_step_and_resume_is_bit_identical(tmp_path: Path, ctrl_c) -> None:
    config, task = tiny("tiny-lm", dropout=0.1)
    c = EXTEND.replace(steps=9, checkpoint_every=100)
    with pytest.raises(TrainingInterrupted) as caught:
        train(config, c, task, tmp_path / "run", callbacks=[ctrl_c(5)], report=False)
    error = caught.value
    assert isinstance(error, KeyboardInterrupt) and error.step == 5
    assert error.checkpoint == tmp_path / "run" / "checkpoints" / "step-000005"
    assert str(error) == f"training interrupted at step 5 of 9; saved {error.checkpoint}"
    assert error.out_dir == tmp_path / "run"
    assert [s for s, _ in checkpoint_dirs(tmp_path / "run")] == [5]
    resumed = train(config, c, task, tmp_path / "run", resume=True, report=False)
    plain = train(config, c, task)
    assert resumed.step == 9 and losses(read_metrics(tmp_path / "run")) == losses(plain.history)


def test_a_second_ctrl_c_stops_at_once_naming_the_last_checkpoint(tmp_path: Path, ctrl_c) -> None:
    config, task = tiny("tiny-lm")
    with pytest.raises(TrainingInterrupted, match=r"at step 4 of 6; the last checkpoint is .*step-000003$"):
        train(config, EXTEND, task, tmp_path, callbacks=[ctrl_c(5, times=2)], report=False)
    assert [s for s, _ in checkpoint_dirs(tmp_path)] == [3]  # step 5 was cut short: nothing saved for it


@pytest.mark.usefixtures("ctrl_c")  # the child must not inherit an ignored SIGINT
def test_ctrl_c_in_a_real_process_prints_the_resume_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "blocklab", "train", *TINY_FLAGS, "--steps", "100000", "--batch-size", "8",
         "--checkpoint-every", "0", "--target-accuracy", "none", "--log-every", "1", "-q", "--no-report",
         "--log-diagnostics", "0", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    metrics = out / "metrics.jsonl"
    try:
        deadline = time.time() + 120
        while not metrics.exists() or len(metrics.read_text().splitlines()) < 3:
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:  # a run that ignored the signal must not outlive the test (it would train for hours)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    step = checkpoint_dirs(out)[-1][0]
    assert proc.returncode == 130 and err.count("\n") == 1, err
    assert err == (f"blocklab: training interrupted at step {step} of 100000; saved "
                   f"{out / 'checkpoints' / f'step-{step:06d}'}; continue with: blocklab train --resume "
                   f"--out {out}\n")
    assert read_metrics(out)[-1]["step"] == step


def test_a_full_disk_during_a_checkpoint_leaves_no_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import blocklab.training.session as train_module  # where checkpoints are written

    config, task = tiny("tiny-lm")
    real = train_module.save_optimizer_state

    def fill_disk(path: Path, model: object, optimizer: object) -> str:
        if "step-000006" in str(path):
            real(path, model, optimizer)  # half of the checkpoint is on disk when the disk fills up
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, model, optimizer)

    monkeypatch.setattr(train_module, "save_optimizer_state", fill_disk)
    with pytest.raises(OSError, match="No space left on device"):
        train(config, EXTEND, task, tmp_path, report=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000003"]
    assert load_checkpoint(tmp_path / "checkpoints" / "step-000003" / "model.safetensors").meta["step"] == 3


def test_metrics_jsonl_is_strict_json_with_null_for_nonfinite_numbers(tmp_path: Path) -> None:
    config, task = tiny()
    c = TrainConfig(steps=9, batch_size=8, log_every=1, checkpoint_every=0, eval_every=100,
                    target_accuracy=None)
    with pytest.raises(TrainingDiverged):
        train(config, c, task, tmp_path, callbacks=[_poison_weight(7)], report=False)

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in metrics.jsonl")

    text = (tmp_path / "metrics.jsonl").read_text()
    lines = [json.loads(line, parse_constant=refuse) for line in text.splitlines()]
    assert lines[-1]["step"] == 8 and lines[-1]["loss"] is None  # the diverged step: NaN written as null
    assert math.isnan(read_metrics(tmp_path)[-1]["loss"])  # read back as NaN


def test_train_config_refuses_values_that_crash_later_and_the_largest_allowed_lr_diverges_cleanly() -> None:
    with pytest.raises(ValueError, match=r"TrainConfig.lr=1e\+38 must be <= 3.40282e\+37 \(float32's larg"):
        TrainConfig(lr=1e38)
    with pytest.raises(ValueError, match=r"TrainConfig.lr=1e\+36 must be <= 3.40282e\+35"):
        TrainConfig(lr=1e36, beta1=0.999)  # the bound is float32's max times (1 - beta1)
    with pytest.raises(ValueError, match="TrainConfig.threads=100000 must be at most 1024"):
        TrainConfig(threads=100000)
    with pytest.raises(ValueError, match=r"TrainConfig.seed=18446744073709551616 must be below 2\*\*64"):
        TrainConfig(seed=2**64)
    config, task = tiny("tiny-lm")
    largest = 3.4028234663852886e38 * (1 - 0.9)  # the boundary itself is allowed: training diverges, no crash
    with pytest.raises(TrainingDiverged, match="step 2: the training loss is nan"):
        train(config, TrainConfig(steps=3, batch_size=8, lr=largest, warmup=0, target_accuracy=None), task)


def test_warmup_as_long_as_the_run_warns_once_it_is_sure_to_train(tmp_path: Path, capsys) -> None:
    from blocklab.cli import main
    from blocklab.errors import BlocklabWarning

    config, task = tiny("tiny-lm")
    with pytest.warns(BlocklabWarning, match=r"warmup=4 >= steps=4: the whole run is warmup, so the peak "
                                             r"learning rate lr=0.005 is reached only at the last step"):
        train(config, EXTEND.replace(steps=4, warmup=4), task, report=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warmup < steps: silent
        train(config, EXTEND.replace(steps=4, warmup=3), task, report=False)
    argv = ["train", "--task", "tiny-lm", "--steps", "3", "--out", str(tmp_path / "run"), "-q", "--no-report"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err == ("blocklab: warning: TrainConfig.warmup=20 >= steps=3: the whole run is warmup, so the "
                   "peak learning rate lr=0.005 is never reached and the cosine decay never runs; lower "
                   "--warmup or raise --steps\n")
    assert main([*argv, "--resume"]) == 0  # nothing left to train: nothing to warn about
    assert "warning" not in capsys.readouterr().err


# ---- language-model metrics ----------------------------------------------------------------------


def test_language_model_metrics_equal_a_hand_count_and_bits_per_character() -> None:
    """Issue 28: a text task is judged per token, not by whole windows; perplexity is exp(loss), and a
    character-level model's bits per character are its total -log2 p over the characters it scored."""
    task = get_task("text", seq_len=16)
    assert task.metric == "token_accuracy" and task.char_level
    torch.manual_seed(0)
    model = bl.Transformer(bl.preset("tiny-lm", vocab_size=task.tokenizer.vocab_size, max_seq_len=16)).eval()
    data = task.split("test")
    data = TaskData(data.inputs[:40], data.targets[:40])
    got = evaluate(model, data, batch_size=16, metric=task.metric, char_level=task.char_level)
    with torch.no_grad():
        logp = model(data.inputs).double().log_softmax(-1)  # (N, T, V)
    scored = data.targets != -100
    picked = logp.gather(-1, data.targets.clamp(min=0)[..., None])[..., 0][scored]  # ln p of each target
    right = (logp.argmax(-1) == data.targets) & scored
    characters = sum(len(task.tokenizer.decode(row[row != -100].tolist())) for row in data.targets)
    assert got["loss"] == pytest.approx(float(-picked.mean()), rel=1e-5)
    assert got["token_accuracy"] == pytest.approx(int(right.sum()) / int(scored.sum()), abs=1e-12)
    assert got["accuracy"] == got["token_accuracy"]
    assert got["exact_match"] == pytest.approx(float((right | ~scored).all(1).double().mean()), abs=1e-12)
    assert got["perplexity"] == pytest.approx(math.exp(got["loss"]), rel=1e-12)
    assert got["bits_per_char"] == pytest.approx(float(-picked.sum()) / math.log(2) / characters, rel=1e-5)
    listops = get_task("listops")
    assert listops.metric == "exact_match" and not listops.char_level
    assert "bits_per_char" not in evaluate(bl.Transformer(bl.preset("listops-seed")), listops.split("test"))


def test_a_language_model_run_reports_token_accuracy_and_perplexity_everywhere(tmp_path, capsys) -> None:
    """The console line, metrics.jsonl, the report and eval all count tokens for a language model."""
    out = tmp_path / "run"
    assert main(["train", "--task", "tiny-lm", "--steps", "4", "--warmup", "1", "--eval-every", "2",
                 "--out", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert "tiny-lm: held-out token accuracy" in printed and "perplexity" in printed
    evals = [r for r in read_metrics(out) if "eval_accuracy" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for row in evals:
        assert row["eval_accuracy"] == row["eval_token_accuracy"]
        assert row["eval_perplexity"] == pytest.approx(math.exp(row["eval_loss"]), rel=1e-12)
        assert "eval_bits_per_char" not in row  # word-level: a token is not a character
    report = (out / "report.html").read_text()
    assert "held-out token accuracy" in report and "held-out perplexity" in report
    assert "held-out exact match" not in report and re.search(r"\d+ of \d+ tokens", report)
    assert main(["eval", "--model", str(out), "--json", "-"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["accuracy"] == record["token_accuracy"] == pytest.approx(evals[-1]["eval_accuracy"])


def test_a_mixture_of_experts_trains_with_transformers_balancing_loss_added() -> None:
    # the oracle: a plain AdamW loop adding coef * transformers' load_balancing_loss_func of the routers'
    # logits (read by torch forward hooks on each router, not by blocklab's own bookkeeping)
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    config, task = tiny(n_experts=4, experts_per_token=2, activation="swiglu", bias=False,
                        router_aux_loss_coef=0.5)
    c = TrainConfig(steps=3, batch_size=8, lr=3e-3, warmup=0, min_lr_ratio=1.0, grad_clip=0.0,
                    weight_decay=0.0, log_every=1, seed=5, **QUIET)
    result = train(config, c, task)
    torch.manual_seed(5)
    model = bl.Transformer(config)
    logits: list[torch.Tensor] = []
    for block in model.blocks:
        block.ffn.router.register_forward_hook(lambda m, i, out: logits.append(out.reshape(-1, 4)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    data, expected = task.split("train"), []
    for step in range(1, 4):
        idx = batch_indices(step, len(data), 8, seed=5)
        logits.clear()
        _, loss = model(data.inputs[idx], data.targets[idx])
        aux = load_balancing_loss_func(tuple(logits), 4, 2)
        expected += [loss.item(), aux.item()]
        opt.zero_grad()
        (loss + 0.5 * aux).backward()
        opt.step()
    reported = [v for r in result.history for v in (r["loss"], r["aux_loss"])]
    assert reported == pytest.approx(expected, rel=1e-5)
    assert all(r["aux_loss"] >= 1.0 - 1e-6 for r in result.history)  # its minimum is 1 (balanced)
    for (name, ours), theirs in zip(result.model.state_dict().items(), model.state_dict().values(),
                                    strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)
