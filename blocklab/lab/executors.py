"""Where a batch of training runs executes: ``local`` worker processes on this machine
(``grid.run_many``), or ``ray``: tasks on a Ray cluster, the one at ``address`` or a local instance
this process starts, bound to 127.0.0.1 and stopped when the batch ends.

Both execute the same ``grid.run_one`` on the same ``RunSpec``, with one torch thread a run unless
the spec sets more, so a run's numbers do not depend on the executor (training is deterministic
given the spec; only its timings differ). Results come back as each run finishes, through
``on_done``, so a caller can show progress and keep finished runs on disk (a batch interrupted by
Ctrl-C or a kill is continued by running it again: ``lab.claims.runner`` and ``lab.ablate`` skip
what is done). Ray is optional: ``pip install 'blocklab[ray]'``.

With a cluster (``address``), every node must have blocklab installed, and runs that write run
folders (``ablate``) need a folder every node sees. A local instance ends with the batch; if this
process is killed (SIGKILL), Ray's own processes follow it, its two agents within about a minute.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..training.loop import share_cores
from ..training.resources import available_cores
from .grid import RunSpec, default_jobs, run_many, run_one

EXECUTORS = ("local", "ray")
LOCALHOST = "127.0.0.1"  # a local Ray instance listens here only
# environment that changes a run's numbers: passed on to Ray's workers (docgen pins ATen's kernels)
NUMERIC_ENV = ("ATEN_CPU_CAPABILITY",)

OnDone = Callable[[RunSpec, dict[str, Any]], None]


@dataclass(frozen=True)
class Executor:
    """Where runs execute: ``kind`` in EXECUTORS; ``jobs``: local worker processes, or the CPUs of the
    local Ray instance (None: this machine's cores); ``address``: an existing Ray cluster (ray only)."""

    kind: str = "local"
    jobs: int | None = None
    address: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"executor {self.kind!r} is not one of: {', '.join(EXECUTORS)}")
        if self.jobs is not None and (isinstance(self.jobs, bool) or not isinstance(self.jobs, int)
                                      or self.jobs < 1):
            raise ValueError(f"jobs={self.jobs!r} must be an integer >= 1")
        if self.address is not None and self.kind != "ray":
            raise ValueError(f"--address {self.address} names a Ray cluster, but the executor is "
                             f"{self.kind!r}: add --executor ray")
        if self.address is not None and self.jobs is not None:
            raise ValueError(f"--jobs {self.jobs} sets the CPUs of a Ray instance this process starts; "
                             f"the cluster at --address {self.address} has its own: leave --jobs out")

    @property
    def workers(self) -> int:
        """Runs at a time on this machine (local, or a local Ray instance's CPUs)."""
        return self.jobs if self.jobs is not None else default_jobs()

    def describe(self) -> str:
        """One line: ``local, 2 jobs``, ``ray (local instance, 2 CPUs)``, ``ray at HOST:PORT``."""
        if self.kind == "local":
            return f"local, {self.workers} job{'s' if self.workers != 1 else ''}"
        return f"ray at {self.address}" if self.address else f"ray (local instance, {self.workers} CPUs)"

    def run(self, specs: Iterable[RunSpec], on_done: OnDone | None = None,
            target: float = 0.9) -> dict[str, dict[str, Any]]:
        """Run every spec; results by key, in spec order (``on_done`` as each finishes)."""
        specs = list(specs)
        if self.kind == "local":
            return run_many(specs, self.workers, on_done, target)
        return _run_on_ray(specs, self, on_done, target)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray, which is not installed: pip install 'blocklab[ray]'") \
            from None
    return ray


def _on_ray_worker(spec: RunSpec, target: float) -> dict[str, Any]:
    """A Ray task: ``run_one`` with each task one core's share ("auto" threads resolve to 1)."""
    share_cores(available_cores())
    return run_one(spec, target)


def _run_on_ray(specs: list[RunSpec], executor: Executor, on_done: OnDone | None,
                target: float) -> dict[str, dict[str, Any]]:
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise ValueError("run keys must be unique")
    results: dict[str, dict[str, Any]] = {}
    if not specs:
        return results
    ray = _ray()
    env = {name: os.environ[name] for name in NUMERIC_ENV if name in os.environ}
    started = not ray.is_initialized()
    if started:
        common = {"runtime_env": {"env_vars": env} if env else None, "log_to_driver": False,
                  "logging_level": logging.ERROR, "configure_logging": True}
        if executor.address:
            ray.init(address=executor.address, **common)
        else:  # a fresh instance of our own, never one found on this machine
            ray.init(address="local", num_cpus=executor.workers, include_dashboard=False,
                     _node_ip_address=LOCALHOST, **common)
    task = ray.remote(num_cpus=1, max_retries=0)(_on_ray_worker)
    pending = {task.remote(spec, target): spec for spec in specs}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                spec = pending.pop(ref)
                results[spec.key] = ray.get(ref)
                if on_done is not None:
                    on_done(spec, results[spec.key])
    except BaseException:  # Ctrl-C, a failed run, a failing callback: nothing queued keeps running
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()
    return {key: results[key] for key in keys}
