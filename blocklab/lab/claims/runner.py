"""Run claims: every setup of every selected claim, its training runs on an executor (``local``
worker processes or ``ray``: ``lab.executors``), and the report (JSON-ready, ``schema.json``) with
each setup's numbers and verdict.

Given a folder (``out``), every finished training run is kept there as it finishes
(``OUT/<claim>/<setup>/<run>/result.json``, beside the folder's marker), so an interrupted run of the
claims continues where it stopped: running it again trains only the runs whose result is missing, was
made from another spec (the registry changed) or by other code (``code_version``: a changed kernel, loop
or task reruns every run), and reads the others back. Each kept run and the report carry the code
version and the registry's hash (``registry_hash``), written before anything trains.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import platform
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from ...files.atomic import refuse_links_below
from ...files.folders import RESULT, check_owned, claim_folder, new_marker, write_marker
from ...files.jsonfiles import read_json, write_json
from ...training.train_config import TrainConfig
from .. import statistics
from ..executors import Executor
from ..grid import RunSpec, default_jobs, result_problem
from . import rules, shared
from .base import Claim, Numbers, combine

# 2: per-setup verdicts and numbers, sources, load average; 3: seeds, controls, observations;
# 4: tests as paired effects with intervals, margins and sensitivity, training settings, registry hash and
# code version (issue 36)
SCHEMA_VERSION = 4
PACKAGE = Path(__file__).resolve().parents[2]  # blocklab/ (lab/claims/runner.py is two below it)
# What a training run's numbers depend on: every module but the claims' own (their measure and verdict
# run again each time), the command line and the explorer.
NOT_TRAINING_CODE = ("lab/claims", "cli", "explore")


def code_version(package: Path = PACKAGE) -> str:
    """A hash of the source that trains a run (the package but ``NOT_TRAINING_CODE``): a kept run made by
    other code is trained again."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if not relative.startswith(NOT_TRAINING_CODE):
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def registry_hash(claims: list[Claim]) -> str:
    """A hash of what the claims state before any run: each claim's sentence, source, method, setups,
    sizes and training settings, the source of its verdict, and the rules (``lab.statistics``,
    ``claims.rules``, and the readings of ``claims.shared`` they are applied to). The notes, written from
    the results, are left out."""
    stated = [
        {
            "name": c.name,
            "kind": c.kind,
            "statement": c.statement,
            "source": c.source.to_dict(),
            "method": c.method,
            "setups": [s.to_dict() for s in c.setups],
            "quick": clean(c.quick),
            "full": clean(c.full),
            "verdict": inspect.getsource(c.verdict),
            "settings": {s.name: training_settings(c.runs(c.full, s)) for s in c.setups} if c.runs else {},
        }
        for c in claims
    ]
    # the rules, and how a run becomes the numbers they read (readings, resolutions, null margins)
    rule_code = "".join(inspect.getsource(part) for part in (
        statistics, rules, shared.run_readings, shared.resolution, shared.null_margin))
    text = json.dumps(stated, sort_keys=True) + rule_code
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# TrainConfig fields that say where and how a run is kept, not how it trains
NOT_SETTINGS = ("seed", "device", "threads", "log_every", "checkpoint_every", "keep_checkpoints")
OPTIMIZER = "AdamW (weight decay on matrices and embeddings, not on biases or norms)"
SCHEDULE = "linear warmup from lr/warmup to lr, then cosine decay to lr x min_lr_ratio"


def training_settings(specs: list[RunSpec]) -> dict[str, Any]:
    """Every training setting of a setup's runs: the optimizer, the schedule, the init and every TrainConfig
    field that trains (``common`` to all runs; ``varied``: the fields the claim's arms set, with their
    values)."""
    if not specs:
        return {}
    configs = [
        {k: v for k, v in TrainConfig(**spec.train).to_dict().items() if k not in NOT_SETTINGS}
        | {"init": spec.model.get("init"), "task": spec.task.get("name")}
        for spec in specs
    ]
    varied = {k: sorted({json.dumps(c[k]) for c in configs}) for k in configs[0]}
    varied = {k: [json.loads(v) for v in vs] for k, vs in varied.items() if len(vs) > 1}
    common = {k: v for k, v in configs[0].items() if k not in varied}
    return {"optimizer": OPTIMIZER, "schedule": SCHEDULE, "common": common, "varied": varied}


def select(claims: list[Claim], names: list[str] | None) -> list[Claim]:
    """The named claims (all for None), in registry order; ValueError naming unknown ones."""
    if not names:
        return list(claims)
    known = [c.name for c in claims]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown claim {', '.join(unknown)}; claims are: {', '.join(known)}")
    return [c for c in claims if c.name in names]


def clean(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become None, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def _cost(spec: RunSpec) -> float:
    """Rough relative cost of a run (steps x layers), to start the longest first."""
    return spec.train.get("steps", 600) * spec.model.get("n_layers", 2)


class LoadSampler:
    """The 1-minute load average, sampled every ``every`` seconds in a background thread."""

    def __init__(self, every: float = 15.0) -> None:
        self.every, self.samples = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        """Mean, min and max of the samples (1-minute load average)."""
        return {
            "mean": round(sum(self.samples) / len(self.samples), 2),
            "min": round(min(self.samples), 2),
            "max": round(max(self.samples), 2),
        }


class RunStore:
    """Finished training runs of a claims folder: one result.json per run key, read back only when it
    was made from the same spec."""

    def __init__(self, folder: str | Path, code: str = "", registry: str = "") -> None:
        self.folder, self.code, self.registry = Path(folder), code, registry

    def path(self, spec: RunSpec) -> Path:
        """Where the result of ``spec`` is kept."""
        return self.folder / spec.key / RESULT

    def finished(self, spec: RunSpec) -> dict[str, Any] | None:
        """The kept result of ``spec``, or None: none kept, unreadable, made from another spec or by other
        code (``code_version``). A symbolic link on the way to where it is kept is refused (ValueError),
        before anything trains."""
        path = self.path(spec)
        refuse_links_below(self.folder, path.parent)
        check_owned(path)  # a regular file or nothing: never a link or a pipe
        if not path.is_file():
            return None
        try:
            result = read_json(path, "a claims run's result.json", result_problem)
        except (OSError, ValueError):
            return None  # a damaged file of our own folder: the run is trained again and it is replaced
        same = isinstance(result, dict) and result.get("spec") == json.loads(json.dumps(spec.to_dict()))
        return result if same and result.get("code") == self.code else None

    def save(self, spec: RunSpec, result: dict[str, Any]) -> None:
        """Keep a finished run's result (never through a link inside the claims folder)."""
        write_json(
            self.path(spec), {**result, "code": self.code, "registry": self.registry}, root=self.folder
        )


def run_claims(
    claims: list[Claim],
    quick: bool = False,
    executor: Executor | None = None,
    out: str | Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every setup of ``claims``; the report: per claim its source, method and overall verdict,
    per setup its fields, numbers, verdict and checks. Training runs go to ``executor`` (default:
    local worker processes, one per core); with ``out``, finished runs are kept there and a rerun
    reads them back instead of training them again."""
    executor = executor or Executor()
    stamp = {"registry": registry_hash(claims), "code": code_version()}  # fixed before anything trains
    if out is None:
        return _run_claims(claims, quick, executor, None, progress, stamp)
    lock, marker = claim_folder(out, "claims")
    try:
        if marker is None:
            write_marker(out, new_marker("claims"))
        return _run_claims(claims, quick, executor, RunStore(out, **stamp), progress, stamp)
    finally:
        lock.release()


def _run_claims(
    claims: list[Claim],
    quick: bool,
    executor: Executor,
    store: RunStore | None,
    progress: bool,
    stamp: dict[str, str],
) -> dict[str, Any]:
    start = time.perf_counter()
    specs = {
        (c.name, s.name): c.runs(c.params(quick), s) if c.runs else []
        for c in claims
        for s in c.setups_run(quick)
    }
    bar = _progress() if progress else None
    bars = {
        c.name: bar.add_task(c.name, total=sum(len(specs[c.name, s.name]) + 1 for s in c.setups_run(quick)))
        if bar
        else None
        for c in claims
    }
    advance: Callable[[str], None] = lambda name: bar.advance(bars[name]) if bar else None
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for spec in (s for ss in specs.values() for s in ss):
        result = store.finished(spec) if store else None
        if result is None:
            todo.append(spec)
        else:
            results[spec.key] = result
            advance(spec.key.split("/")[0])
    kept = len(results)  # runs read back from the folder, trained by an earlier invocation
    todo.sort(key=_cost, reverse=True)
    with LoadSampler() as load, bar if bar else nullcontext():
        measured, seconds = _train_and_measure(claims, quick, executor, store, specs, results, todo, advance)
    return {
        **_header(quick, executor, stamp),
        "seconds": round(time.perf_counter() - start, 1),
        "training": {
            "runs": len(results),
            "kept": kept,
            "seconds": round(sum(r["seconds"] for r in results.values()), 1),
        },
        "load_average": load.summary(),
        "claims": [_claim_report(c, quick, specs, measured, seconds) for c in claims],
    }


# long because the training runs and the untrained claims' measurement share its state across two threads
def _train_and_measure(
    claims: list[Claim],
    quick: bool,
    executor: Executor,
    store: RunStore | None,
    specs: dict[tuple[str, str], list[RunSpec]],
    results: dict[str, dict[str, Any]],
    todo: list[RunSpec],
    advance: Callable[[str], None],
) -> tuple[dict[tuple[str, str], Numbers], dict[tuple[str, str], float]]:
    """Train ``todo`` (into ``results``) while the exact and init claims are measured beside; then measure
    the training claims. Returns each setup's numbers and seconds."""
    measured: dict[tuple[str, str], Numbers] = {}
    seconds: dict[tuple[str, str], float] = {}

    def finished(spec: RunSpec, result: dict[str, Any]) -> None:
        if store:
            store.save(spec, result)
        advance(spec.key.split("/")[0])

    stop = threading.Event()  # set when the command ends: the thread beside stops between two setups

    def measure(claim: Claim) -> None:
        for setup in claim.setups_run(quick):
            if stop.is_set():
                return
            t0 = time.perf_counter()
            measured[claim.name, setup.name] = clean(claim.measure(claim.params(quick), setup, results))
            own = sum(results[s.key]["seconds"] for s in specs[claim.name, setup.name])
            seconds[claim.name, setup.name] = time.perf_counter() - t0 + own
            advance(claim.name)

    failure: list[BaseException] = []

    def measure_untrained() -> None:  # exact and init claims, beside the training runs
        try:
            for claim in (c for c in claims if not c.runs):
                measure(claim)
        except BaseException as error:  # re-raised in the calling thread below
            failure.append(error)

    beside = threading.Thread(target=measure_untrained, daemon=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: one thread is fastest, and the workers have the other cores
    try:
        beside.start()
        # the training runs from this thread, so Ctrl-C reaches the executor's loop, which stops them
        results.update(executor.run(todo, finished))
        beside.join()
        if failure:
            raise failure[0]
        for claim in (c for c in claims if c.runs):
            measure(claim)
    finally:  # a thread left inside torch when the interpreter exits aborts it (std::terminate, SIGABRT)
        stop.set()
        if beside.is_alive():
            beside.join()
        torch.set_num_threads(threads)
    return measured, seconds


QUICK_WARNING = (
    "a smoke run at reduced sizes, source setups only: it exercises every claim, and its "
    "verdicts are not evidence"
)


def _header(quick: bool, executor: Executor, stamp: dict[str, str]) -> dict[str, Any]:
    """What the report says about itself: its schema, mode, jobs, registry and code, the machine."""
    return {
        "schema_version": SCHEMA_VERSION,
        "mode": "quick" if quick else "full",
        **({"warning": QUICK_WARNING} if quick else {}),
        **stamp,
        "jobs": executor.workers,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": default_jobs(),
            "platform": platform.platform(),
        },
    }


def _claim_report(
    claim: Claim,
    quick: bool,
    specs: dict[tuple[str, str], list[RunSpec]],
    measured: dict[tuple[str, str], Numbers],
    seconds: dict[tuple[str, str], float],
) -> dict[str, Any]:
    setups = []
    for setup in claim.setups_run(quick):
        m = measured[claim.name, setup.name]
        setups.append(
            {
                **setup.to_dict(),
                "runs": len(specs[claim.name, setup.name]),
                "seconds": round(seconds[claim.name, setup.name], 2),
                "training": training_settings(specs[claim.name, setup.name]),
                "headline": claim.headline(m),
                **claim.verdict(m).to_dict(),
                "measurements": m,
            }
        )
    verdict, reason = combine([(s["name"], s["role"], s["verdict"]) for s in setups])
    deciding = next(s for s in setups if s["role"] in ("source", "exact"))
    return {
        "name": claim.name,
        "kind": claim.kind,
        "statement": claim.statement,
        "source": claim.source.to_dict(),
        "method": claim.method,
        "notes": claim.notes,
        "params": clean(claim.params(quick)),
        "runs": sum(s["runs"] for s in setups),
        "seconds": round(sum(s["seconds"] for s in setups), 2),
        "verdict": verdict,
        "reason": reason,
        "sensitivity": deciding["sensitivity"],
        "setups": setups,
    }


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )


def schema() -> dict[str, Any]:
    """The JSON schema of a claims report (``schema.json``)."""
    return json.loads(resources.files(__package__).joinpath("schema.json").read_text())
