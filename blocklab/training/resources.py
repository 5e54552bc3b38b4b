"""How a training process shares the machine and its signals: the cores it may use (``available_cores``),
the processes side by side (``share_cores``), torch's intra-op threads (``resolve_threads``), and a first
Ctrl-C deferred to the end of the step in progress (``deferred_interrupt``), so that the step can be
checkpointed.
"""

from __future__ import annotations

import math
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")  # where this process's CPU quota is read (cgroup v2, else v1)


def cgroup_cpus(root: Path = CGROUP) -> float | None:
    """The CPUs this process's cgroup quota allows (quota / period), or None without a quota: cgroup v2's
    ``cpu.max`` ("max 100000" is none), else v1's ``cpu/cpu.cfs_quota_us`` (-1 is none)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def available_cores(root: Path = CGROUP) -> int:
    """The cores this process may use: those its CPU affinity allows, fewer under a cgroup quota (rounded
    up: a quota of 1.5 CPUs still runs 2 threads part of the time), and at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpus(root)
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def omp_threads() -> int | None:
    """OMP_NUM_THREADS when it holds a positive integer (the user's thread count), else None."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


@contextmanager
def deferred_interrupt(enabled: bool = True, second_interrupts: bool = True) -> Iterator[list[bool]]:
    """While active, a first Ctrl-C (SIGINT) only sets ``flag[0]``, so the step in progress finishes
    and can be checkpointed; a second one interrupts at once (unless ``second_interrupts`` is False:
    then every one only sets the flag). Only in the main thread, and only when SIGINT has Python's
    default handler (a worker that ignores it keeps ignoring it)."""
    flag = [False]
    usable = enabled and threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if not usable:
        yield flag
        return

    def handler(signum: int, frame: object) -> None:
        if flag[0] and second_interrupts:
            raise KeyboardInterrupt
        flag[0] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


# Processes one parent runs side by side on this machine (lab.grid's worker pool), set in each
# worker by ``share_cores``. Without it every worker's "auto" would take all the cores: 2 workers x 2
# threads on 2 cores oversubscribe OpenMP, whose spinning threads then run a small model ~10x slower.
_side_by_side = 1


def share_cores(processes: int) -> None:
    """Declare this process one of ``processes`` that share the machine's cores (a pool's workers):
    "auto" threads (``resolve_threads(0)``) then divide the cores among them, as under torchrun."""
    if processes < 1:
        raise ValueError(f"processes={processes}: at least one process runs")
    global _side_by_side
    _side_by_side = processes


def resolve_threads(threads: int) -> int:
    """torch intra-op threads for this process: ``threads``, or for 0 ("auto") the cores this process may
    use (``available_cores``: affinity and cgroup quota), divided among the processes torchrun started on
    this machine (or the worker processes sharing it, ``share_cores``), and never more than
    OMP_NUM_THREADS when the user set it."""
    if threads:
        return threads
    sharing = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) * _side_by_side
    auto = max(1, available_cores() // sharing)
    user = omp_threads()
    return min(auto, user) if user is not None else auto
