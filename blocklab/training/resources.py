"""How a training process shares the machine and its signals: the processes side by side (``share_cores``),
torch's intra-op threads (``resolve_threads``), and a first Ctrl-C deferred to the end of the step in
progress (``deferred_interrupt``), so that the step can be checkpointed.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deferred_interrupt(enabled: bool = True) -> Iterator[list[bool]]:
    """While active, a first Ctrl-C (SIGINT) only sets ``flag[0]``, so the step in progress finishes
    and can be checkpointed; a second one interrupts at once. Only in the main thread, and only
    when SIGINT has Python's default handler (a worker that ignores it keeps ignoring it)."""
    flag = [False]
    usable = enabled and threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if not usable:
        yield flag
        return

    def handler(signum: int, frame: object) -> None:
        if flag[0]:
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
    """torch intra-op threads for this process: ``threads``, or for 0 ("auto") the cores this
    process may run on, divided among the processes torchrun started on this machine (or the
    worker processes sharing it, ``share_cores``)."""
    if threads:
        return threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    sharing = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) * _side_by_side
    return max(1, cores // sharing)
