"""Many training runs, described as data and run inline or in parallel worker processes.

A ``RunSpec`` names everything a run needs (preset, ModelConfig and TrainConfig fields, task,
seed, folder). ``run_one`` trains it with ``train.train`` and returns a JSON-ready result;
``run_many`` runs a list of them, ``jobs`` at a time in worker processes, and calls back as each
finishes (for progress bars and resumable grids). A run trains with one torch thread unless its
spec sets ``threads`` (0: its share of the cores, ``train.share_cores``): a grid is parallel across
runs, and one thread makes a run's numbers the same inline or in a worker and whatever the
machine's core count (1 and 2 threads differ in the last bits, and training amplifies them).
Training is deterministic given the spec. Workers end with their parent
however it ends (Ctrl-C, SIGTERM, SIGKILL): ``end_with_parent``; they ignore Ctrl-C themselves.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from typing import Any

import torch

from ..inspect.diagnostics import DiagnosticsLogger, diagnose
from ..nn.presets import preset
from ..tasks import task_from_dict
from ..training.loop import TrainConfig, TrainingDiverged, resolve_threads, share_cores, train
from ..training.resources import available_cores, deferred_interrupt


@dataclass(frozen=True)
class RunSpec:
    """One training run. ``model`` overrides the preset's fields; ``train`` sets TrainConfig fields."""

    key: str  # unique within a batch of runs: "no-residual-depth/none/L10/s0"
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] = field(default_factory=lambda: {"name": "listops"})
    preset: str = "listops-seed"
    out_dir: str | None = None  # None: nothing written to disk
    log_diagnostics: int = 0  # every K steps into metrics.jsonl ("diag"); 0: off
    diagnose_after: bool = False  # measure diagnostics on held-out examples after training
    report: bool = False  # write report.html into out_dir
    resume: bool = False  # continue from out_dir's newest checkpoint

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return asdict(self)


MAX_RUNS = 10_000  # training runs planned at once (ablate's cells x seeds, claims' runs): one spec each
LAB_THREADS = 1  # a run's torch threads unless its spec sets them (see the module's docstring)


MAX_INT = 2**63 - 1  # the largest integer a result may hold: beyond it float(), numpy and matplotlib overflow


def _number(value: Any, nullable: bool = True) -> bool:
    if value is None or isinstance(value, bool):
        return value is None and nullable
    return isinstance(value, float) or isinstance(value, int) and abs(value) <= MAX_INT


def _count(value: Any) -> bool:
    return value is None or isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT


def _rows_problem(rows: Any, name: str, lists: tuple[str, ...] = ()) -> str | None:
    """What is wrong with a list of per-step rows (``curve``, ``diag``); ``lists``: keys every row has, each
    a list of numbers."""
    if not isinstance(rows, list):
        return f"{name} must be a list of objects"
    for i, row in enumerate(rows):
        if not (isinstance(row, dict) and row.get("step") is not None and _count(row["step"])):  # {}: no step
            return f"{name}[{i}] must be an object with an integer step in [0, {MAX_INT}]"
        missing = [key for key in lists if key not in row]
        if missing:
            return f"{name}[{i}].{missing[0]} is missing (a list of numbers)"
        for key, value in row.items():
            ok = (isinstance(value, list) and all(_number(v) for v in value)) if key in lists else \
                key not in ("loss", "eval_loss", "eval_accuracy") or _number(value)
            if not ok:
                what = "list of numbers" if key in lists else "number"
                return f"{name}[{i}].{key}={value!r:.60} is not a {what} (at most {MAX_INT} in size)"
    return None


def result_problem(result: Any) -> str | None:
    """What is wrong with a parsed result.json (what ``run_one`` returns), or None: the schema a grid
    checks before it uses a finished run's result."""
    if not isinstance(result, dict):
        return f"expected a JSON object (a run's result), found {type(result).__name__}"
    checks = [
        ("diverged", isinstance(result.get("diverged"), bool), "true or false"),
        ("accuracy", _number(result.get("accuracy"), nullable=False) and 0 <= result["accuracy"] <= 1,
         "a number in [0, 1]"),
        ("eval_loss", _number(result.get("eval_loss")), "a number or null"),
        ("loss", _number(result.get("loss")), "a number or null"),
        ("seconds", _number(result.get("seconds"), nullable=False) and result["seconds"] >= 0,
         "a number >= 0"),
        ("steps_to_target", _count(result.get("steps_to_target")), f"an integer in [0, {MAX_INT}] or null"),
    ]
    for key, ok, rule in checks:
        if key not in result:
            return f"{key} is missing ({rule})"
        if not ok:
            return f"{key}={result.get(key)!r:.60} must be {rule}"
    return _rows_problem(result.get("curve"), "curve") or (
        _rows_problem(result["diag"], "diag", lists=("grad_resid",)) if "diag" in result else None)


def steps_to_target(history: list[dict[str, Any]], target: float) -> int | None:
    """The first evaluated step whose held-out accuracy reached ``target`` (None: never)."""
    for row in history:
        if row.get("eval_accuracy", -1.0) >= target:
            return int(row["step"])
    return None


def run_one(spec: RunSpec, target: float = 0.9) -> dict[str, Any]:
    """Train ``spec``; a JSON-ready result: accuracy, losses, diverged, steps to ``target``, curve, timing.

    A run whose loss or gradient turns NaN/Inf is ``diverged`` with accuracy 0 (its weights are unusable).
    """
    task = task_from_dict(spec.task)
    config = preset(spec.preset, **{**task.config_overrides(), **spec.model})
    tc = TrainConfig(**{"threads": LAB_THREADS, **spec.train})
    callbacks = [DiagnosticsLogger(spec.log_diagnostics)] if spec.log_diagnostics else []
    start = time.perf_counter()
    result: dict[str, Any] = {"key": spec.key, "spec": spec.to_dict(), "diverged": False}
    try:
        run = train(
            config,
            tc,
            task,
            spec.out_dir,
            callbacks=callbacks,
            resume=spec.resume,
            overwrite=not spec.resume,
            report=spec.report,
        )
    except TrainingDiverged as error:
        result.update(
            diverged=True,
            accuracy=0.0,
            eval_loss=math.nan,
            loss=math.nan,
            steps=None,
            error=str(error),
            curve=[],
            steps_to_target=None,
            seconds=time.perf_counter() - start,
        )
        return result
    curve = [
        {k: row[k] for k in ("step", "loss", "eval_loss", "eval_accuracy") if k in row} for row in run.history
    ]
    result.update(
        accuracy=run.accuracy,
        eval_loss=run.eval.get("loss", math.nan),
        loss=run.loss,
        steps=run.step,
        stopped=run.stopped,
        threads=resolve_threads(tc.threads),
        seconds=time.perf_counter() - start,
        tokens_per_s=run.tokens_per_s,
        curve=curve,
        steps_to_target=steps_to_target(run.history, target),
        diag=[{"step": row["step"], **row["diag"]} for row in run.history if "diag" in row],
    )
    if spec.diagnose_after:
        test = task.split("test")
        run.model.eval()
        mask = None if test.attention_mask is None else test.attention_mask[:256]
        result["diag_after"] = diagnose(run.model, test.inputs[:256], test.targets[:256], mask).summary()
    return result


# ---- worker processes: they end with their parent, however it ends -----------------------------------

PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when its parent dies


def end_with_parent(parent: int) -> None:
    """In a worker process: die when ``parent`` dies, even by SIGKILL. On Linux the kernel sends SIGKILL
    (prctl PR_SET_PDEATHSIG); everywhere a daemon thread also checks once a second that the parent
    is alive, and a parent already gone ends the worker at once."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:  # an orphan is adopted by another process: its parent id changes
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="blocklab-parent-watch", daemon=True).start()


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile. A process started meanwhile begins with it blocked (the
    signal mask passes through fork and exec), so a Ctrl-C while a worker imports torch stays pending
    there until ``_worker_init`` ignores it. This process may still receive it in another thread
    (OpenMP's, a progress bar's), whose handler would raise KeyboardInterrupt here between a worker's
    start and the sending of its start data: that worker, not yet in the pool, would read nothing
    (EOFError in ``spawn_main``, a traceback on the terminal). So a Ctrl-C is only noted meanwhile,
    and raised when the block ends."""
    with deferred_interrupt(second_interrupts=False) as pressed:
        if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
            yield
        else:
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                yield
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if pressed[0]:
        raise KeyboardInterrupt


def _worker_init(parent: int, workers: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    if hasattr(signal, "pthread_sigmask"):  # blocked since the start (sigint_blocked): now ignored, dropped
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    end_with_parent(parent)
    share_cores(workers)  # a run's "auto" threads: its share of the cores (one each for jobs = cores)
    torch.set_num_threads(resolve_threads(0))


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's worker processes now (their runs' last checkpoints stay; a rerun resumes them)."""
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14+
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
        process.join(timeout=10)


def run_many(
    specs: Iterable[RunSpec],
    jobs: int = 1,
    on_done: Callable[[RunSpec, dict[str, Any]], None] | None = None,
    target: float = 0.9,
) -> dict[str, dict[str, Any]]:
    """Run every spec (``jobs`` worker processes, 1: inline); results by key, in spec order."""
    specs = list(specs)
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise ValueError("run keys must be unique")
    results: dict[str, dict[str, Any]] = {}

    def finish(spec: RunSpec, result: dict[str, Any]) -> None:
        results[spec.key] = result
        if on_done is not None:
            on_done(spec, result)

    if jobs <= 1 or len(specs) <= 1:
        for spec in specs:
            finish(spec, run_one(spec, target))
    else:
        context = get_context("spawn")  # fork after torch has started threads can deadlock
        workers = min(jobs, len(specs))
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                                   initargs=(os.getpid(), workers))
        try:
            with sigint_blocked():  # the workers start here; from their first instruction Ctrl-C is ours
                pending = {pool.submit(run_one, spec, target): spec for spec in specs}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    finish(pending.pop(future), future.result())
        except BaseException:  # Ctrl-C, a failed run, a failing callback: no worker keeps training
            stop_workers(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return {key: results[key] for key in keys}


def default_jobs() -> int:
    """Worker processes to use by default: the cores this process may use (affinity, cgroup quota)."""
    return available_cores()
