"""Running claims (blocklab/lab/claims/runner.py): Ctrl-C stops the queued training runs at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from processes import descendants

from blocklab.lab.claims import Claim, Setup, Source
from blocklab.lab.claims.runner import run_claims
from blocklab.lab.executors import Executor
from blocklab.lab.grid import RunSpec

TRAIN = {"steps": 300, "batch_size": 8, "log_every": 1, "eval_every": 10**6, "checkpoint_every": 0,
         "target_accuracy": None}


def _claim(out: Path, runs: int) -> Claim:
    def specs(params: dict, setup: Setup) -> list[RunSpec]:
        return [RunSpec(key=f"fake/{setup.name}/{i}", preset="tiny-lm", task={"name": "tiny-lm"},
                        train={**TRAIN, "seed": i}, out_dir=str(out / setup.name / str(i)))
                for i in range(runs)]

    return Claim(name="fake", kind="training", statement="a claim that only trains", method="train",
                 source=Source("a test", "-", "-"), quick={}, full={},
                 setups=(Setup("a", "source", "the runs"), Setup("b", "confound", "more runs")),
                 measure=lambda params, setup, results: {}, verdict=None, headline=None, plot=None,
                 runs=specs)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_stops_the_queued_runs_at_once(tmp_path: Path) -> None:
    """Issue 30, H1: the runs were waited for in a background thread, so Ctrl-C ended the main thread
    while every queued run still trained (the process exited minutes later). Ctrl-C stops the workers
    before run_claims returns, and the queue is never drained."""
    claim = _claim(tmp_path, runs=4)  # 8 runs, 2 at a time
    training = threading.Event()

    def press_ctrl_c_once_a_run_trains() -> None:
        while not any(tmp_path.rglob("metrics.jsonl")):
            if training.wait(0.05):
                return
        os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c_once_a_run_trains, daemon=True)
    presser.start()
    with pytest.raises(KeyboardInterrupt):
        run_claims([claim], quick=True, executor=Executor(jobs=2), progress=False)
    training.set()
    workers = [pid for pid in descendants(os.getpid())  # (multiprocessing's resource tracker may stay)
               if b"spawn_main" in (Path("/proc") / str(pid) / "cmdline").read_bytes()]
    assert workers == []  # no worker left training
    finished = [p for p in tmp_path.rglob("checkpoints") if any(p.iterdir())]
    assert len(finished) < 8  # the queue was not drained
