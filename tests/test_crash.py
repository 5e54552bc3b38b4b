"""Crash safety: SIGKILL a training process at many random moments, checkpoint writes included.

After every kill the newest checkpoint loads (weights, AdamW state, state.json) and the next
process resumes from it; the run finally completes with the losses and weights of a run that
was never interrupted, bit for bit.

The kills are driven by a separate Python process (this file run as a script) that imports
torch and warms it up with a two-step run once, then forks one training child per trial, so a
trial costs no start-up. The parent computes with one thread only (no OpenMP pool to inherit).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STEPS = 120  # training steps of the run; the kills land somewhere inside it
TRIALS = 14  # kills per test run
# Kill delays scale with the measured length of the uninterrupted run: drawn from
# [0, 1.5 * reference_seconds / TRIALS], the kills use up about 3/4 of the run on average,
# so on a fast, quiet machine as on a loaded one nearly every session dies before the end.
DELAY_SPREAD = 1.5


def _train_config(checkpoint_every: int):  # TrainConfig, imported lazily
    from blocklab.training.loop import TrainConfig

    # threads=1, the driver's own count: a forked child that grows torch's OpenMP pool can hang
    return TrainConfig(steps=STEPS, batch_size=8, warmup=10, eval_every=20, log_every=1,
                       checkpoint_every=checkpoint_every, keep_checkpoints=2, target_accuracy=None, threads=1)


def _run(out: Path | None, checkpoint_every: int, steps: int = STEPS) -> None:
    """Train tiny-lm, resuming the run in ``out`` if there is one (a kill may land before its marker)."""
    from blocklab import preset
    from blocklab.tasks import get_task
    from blocklab.training.loop import train

    task = get_task("tiny-lm")
    train(preset("tiny-lm", **task.config_overrides()), _train_config(checkpoint_every).replace(steps=steps),
          task, out, resume=out is not None and (out / "blocklab-run.json").exists(), report=False)


def _child(out: Path, checkpoint_every: int) -> None:
    """A training process: resume the run in ``out`` (or start it) and train to the end."""
    try:
        _run(out, checkpoint_every)
        os._exit(0)
    except BaseException as error:  # reported to the driver through the exit status
        print(f"child failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        os._exit(3)


def _fork(out: Path, checkpoint_every: int) -> int:
    pid = os.fork()
    if pid == 0:
        _child(out, checkpoint_every)
    return pid


def _inspect(out: Path) -> dict[str, object]:
    """What a kill left behind: the newest checkpoint (which must load) and any half-written files."""
    import torch

    from blocklab.files.folders import MODEL_FILE
    from blocklab.files.jsonfiles import read_json
    from blocklab.training.checkpoint import load_checkpoint
    from blocklab.training.loop import make_optimizer
    from blocklab.training.runfiles import latest_checkpoint, read_metrics
    from blocklab.training.state import OPTIMIZER_FILE, STATE_FILE, load_optimizer_state

    partial = [p.name for p in out.rglob("*") if p.name.startswith((".tmp-step-", ".old-step-"))
               or (p.name.startswith(".") and p.name.endswith(".tmp"))]
    latest = latest_checkpoint(out)
    step = None
    if latest is not None:
        model = load_checkpoint(latest / MODEL_FILE).model
        load_optimizer_state(latest / OPTIMIZER_FILE, model, make_optimizer(model, _train_config(1)))
        step = read_json(latest / STATE_FILE)["step"]
        assert latest.name == f"step-{step:06d}", (latest, step)
        assert all(torch.isfinite(p).all() for p in model.parameters())
    read_metrics(out)  # parses; a torn last line is skipped
    return {"step": step, "partial": partial}


def drive(root: Path, seed: int) -> dict[str, object]:
    """Reference run, TRIALS killed-and-resumed sessions, a final session; everything it saw."""
    import torch

    torch.set_num_threads(1)
    _run(None, 0, steps=2)  # load every lazily initialised kernel once, before forking

    rng = random.Random(seed)
    reference, crashed = root / "reference", root / "crashed"
    started = time.perf_counter()
    # never interrupted; a checkpoint every step like the trials, so its time sets their kill delays
    # (a run without them is several times faster: the kills would all land before the first step)
    pid = _fork(reference, checkpoint_every=1)
    assert os.waitpid(pid, 0)[1] == 0
    max_delay = DELAY_SPREAD * (time.perf_counter() - started) / TRIALS
    trials = []
    for _ in range(TRIALS):
        pid = _fork(crashed, checkpoint_every=1)  # a checkpoint every step: most kills hit a write
        delay = rng.uniform(0.0, max_delay)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)  # reaped: its PID is gone, its flock released
        trials.append({"delay": round(delay, 3), "killed": os.WIFSIGNALED(status), **_inspect(crashed)})
    pid = _fork(crashed, checkpoint_every=1)
    final_status = os.waitpid(pid, 0)[1]
    return {"trials": trials, "final_status": final_status, "final": _inspect(crashed)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks its training children")
def test_sigkill_at_random_moments_never_loses_a_checkpoint_and_resume_is_exact(tmp_path: Path) -> None:
    import torch

    from blocklab.files.folders import MODEL_FILE
    from blocklab.training.checkpoint import load_checkpoint
    from blocklab.training.runfiles import latest_checkpoint, read_metrics

    result = subprocess.run([sys.executable, __file__, str(tmp_path), "9"], capture_output=True, text=True,
                            timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    trials = report["trials"]
    killed = [t for t in trials if t["killed"]]
    assert len(killed) >= TRIALS - 2  # (a child may finish a very short session first)
    steps = [t["step"] or 0 for t in trials]
    assert steps == sorted(steps) and steps[-1] > 0  # progress is never lost
    assert any(t["partial"] for t in killed), trials  # some kills landed inside a checkpoint write
    assert report["final_status"] == 0 and report["final"]["step"] == STEPS

    crashed, reference = tmp_path / "crashed", tmp_path / "reference"
    losses = {r["step"]: r["loss"] for r in read_metrics(crashed) if "loss" in r}
    expected = {r["step"]: r["loss"] for r in read_metrics(reference) if "loss" in r}
    assert sorted(losses) == list(range(1, STEPS + 1)) and losses == expected
    a = load_checkpoint(latest_checkpoint(crashed) / MODEL_FILE).model.state_dict()
    b = load_checkpoint(latest_checkpoint(reference) / MODEL_FILE).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(json.dumps(drive(Path(sys.argv[1]), int(sys.argv[2]))))
