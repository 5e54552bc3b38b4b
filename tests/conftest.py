"""Shared test settings: deterministic seeds, no hub downloads."""

import os
import signal
from collections.abc import Callable, Iterator

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def ctrl_c() -> Iterator[Callable[..., Callable[[object], None]]]:
    """Ctrl-C as a terminal delivers it, whatever the suite was launched from.

    A suite started in the background by a non-interactive shell (``cmd &``, nohup) begins with
    SIGINT ignored: Python keeps an ignored SIGINT ignored and child processes inherit it, and
    blocklab rightly leaves an ignored SIGINT alone (a grid worker relies on that). So a test of
    Ctrl-C installs Python's default handler for its duration; children it starts then begin with
    the default disposition. Yields ``at_step(step, times=1)``: a ``train()`` callback that sends
    SIGINT to this process ``times`` times during that step.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def at_step(step: int, times: int = 1) -> Callable[[object], None]:
        def callback(ctx: object) -> None:  # Ctrl-C arriving during a step
            if ctx.step == step:
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGINT)

        return callback

    try:
        yield at_step
    finally:
        signal.signal(signal.SIGINT, previous)
