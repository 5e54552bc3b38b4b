"""Parallel runs (blocklab/lab/grid.py): worker processes end with their parent, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from processes import alive, descendants

GRID = """
import sys
from blocklab.lab.grid import RunSpec, run_many

out = sys.argv[1]
train = {"steps": 10**7, "batch_size": 8, "log_every": 1, "eval_every": 10**7, "checkpoint_every": 0,
         "target_accuracy": None}
specs = [RunSpec(key=f"r{i}", preset="tiny-lm", task={"name": "tiny-lm"}, train={**train, "seed": i},
                 out_dir=f"{out}/r{i}") for i in range(2)]
run_many(specs, jobs=2)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "Ctrl-C"])
@pytest.mark.usefixtures("ctrl_c")  # the grid's parent must not inherit an ignored SIGINT
def test_no_worker_outlives_a_killed_grid(how: str, tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", GRID, str(tmp_path)], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: set[int] = set()
    try:
        deadline = time.time() + 240
        metrics = [tmp_path / f"r{i}" / "metrics.jsonl" for i in range(2)]
        while not all(m.exists() and m.stat().st_size for m in metrics):  # both workers are training
            assert time.time() < deadline and parent.poll() is None, parent.stderr.read().decode()
            time.sleep(0.1)
        workers = descendants(parent.pid)
        assert len(workers) >= 2
        if how == "Ctrl-C":
            os.killpg(parent.pid, signal.SIGINT)  # what a terminal does: the whole foreground group
        else:
            os.kill(parent.pid, getattr(signal, how))  # what timeout does (SIGTERM), or kill -9
        parent.wait(timeout=60)
        deadline = time.time() + 30
        while any(alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if alive(w)], f"workers outlived their parent ({how})"
    finally:  # whatever happened, leave nothing running (orphans included)
        for pid in {parent.pid, *workers, *descendants(parent.pid)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait()


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no signal masks")
@pytest.mark.usefixtures("ctrl_c")
def test_a_ctrl_c_while_workers_start_is_raised_only_once_they_have_started() -> None:
    """Issue 35 (seen in CI): SIGINT blocked in the main thread still reached the process through
    another thread (OpenMP's, a progress bar's), and Python raised KeyboardInterrupt in the main thread
    between a worker's start and the sending of its start data: that worker read nothing (EOFError
    in spawn_main, a traceback under the interrupted line). The Ctrl-C now waits for the block's end."""
    from blocklab.lab.grid import sigint_blocked

    go, sent = threading.Event(), threading.Event()

    def other_thread() -> None:  # started before the block: SIGINT is not blocked here
        go.wait()
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # delivered to this thread
        sent.set()

    thread = threading.Thread(target=other_thread, daemon=True)
    thread.start()
    started = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_blocked():
            go.set()
            assert sent.wait(10)
            for _ in range(1000):  # bytecodes at which Python would run a pending handler
                time.sleep(0)
            started.append("the workers")
    assert started == ["the workers"]
    thread.join(10)


def test_workers_share_the_cores() -> None:
    """A run trains with one thread unless its spec sets threads; "auto" (0) in a worker is its share
    of the cores, never all of them (2 workers x 2 threads on 2 cores oversubscribe OpenMP ~10x)."""
    from blocklab.lab.grid import RunSpec, run_many

    train = {"steps": 2, "batch_size": 4, "log_every": 1, "eval_every": 2, "checkpoint_every": 0,
             "target_accuracy": None}
    specs = [RunSpec(key=key, preset="tiny-lm", task={"name": "tiny-lm"}, train={**train, **extra})
             for key, extra in (("lab", {}), ("auto", {"threads": 0}), ("three", {"threads": 3}))]
    results = run_many(specs, jobs=2)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert [results[k]["threads"] for k in ("lab", "auto", "three")] == [1, max(1, cores // 2), 3]


@pytest.mark.parametrize(("curve", "problem"), [
    ([{}], "curve[0] must be an object with an integer step in [0, 9223372036854775807]"),  # was a KeyError
    ([{"step": None}], "curve[0] must be an object with an integer step in [0, 9223372036854775807]"),
    ([{"step": -1}], "curve[0] must be an object with an integer step in [0, 9223372036854775807]"),
    ([{"step": 3, "loss": "x"}], "curve[0].loss='x' is not a number (at most 9223372036854775807 in size)"),
    ([{"step": 3, "loss": 0.5}], None),
])
def test_a_result_curve_row_without_a_step_is_a_problem_not_a_key_error(curve: list,
                                                                        problem: str | None) -> None:
    from blocklab.lab.grid import _rows_problem

    assert _rows_problem(curve, "curve") == problem
