"""Shared by the claim tests: arms of per-seed numbers, as a claim's ``measure`` reads them from finished
runs, built from the numbers a test wants each seed to show."""

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from blocklab.lab.claims.shared import outcome


def _run(
    accuracy: float | None,
    reach: int | None,
    loss: float,
    train_loss: float,
    budget: int,
    every: int,
    seconds: float,
) -> dict[str, Any]:
    """A finished run whose final evaluation shows ``accuracy`` and ``loss`` (its lowest held-out loss) and
    whose training loss ends at ``train_loss``; it reached 99% at ``reach`` (None: never)."""
    last = reach if reach is not None else budget
    curve = [
        {"step": step, "loss": train_loss + 1.0, "eval_loss": loss + 1.0, "eval_accuracy": 0.1}
        for step in range(every, last, every)
    ]
    curve.append(
        {
            "step": last,
            "loss": train_loss,
            "eval_loss": loss,
            "eval_accuracy": 0.995 if reach is not None else (accuracy or 0.0),
        }
    )
    return {
        "accuracy": 0.0 if accuracy is None else accuracy,
        "diverged": accuracy is None,
        "curve": curve,
        "eval_loss": loss,
        "loss": train_loss,
        "seconds": seconds,
        "steps": last,
        "spec": {"train": {"steps": budget, "eval_every": every}, "task": {"name": "listops"}},
    }


def _arm(
    accuracy: Sequence[float | None],
    steps: Sequence[int | None] | None = None,
    budget: int = 600,
    loss: Sequence[float] | None = None,
    train_loss: Sequence[float] | None = None,
    every: int = 25,
    seconds: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One arm's numbers as ``shared.outcome`` gives them: ``accuracy`` per seed (None: diverged); ``steps``
    to the target per seed (default: 100 where the accuracy is at least 0.99, else not reached); the lowest
    held-out ``loss``, the final ``train_loss`` and the ``seconds`` per seed (defaults: 1.0)."""
    n = len(accuracy)
    steps = steps if steps is not None else [100 if a is not None and a >= 0.99 else None for a in accuracy]
    loss, train_loss, seconds = loss or [1.0] * n, train_loss or [1.0] * n, seconds or [1.0] * n
    return outcome(
        [
            _run(a, r, lo, tl, budget, every, s)
            for a, r, lo, tl, s in zip(accuracy, steps, loss, train_loss, seconds, strict=True)
        ]
    )


@pytest.fixture
def arm() -> Callable[..., dict[str, Any]]:
    """``arm(accuracy per seed, steps per seed=None, ...)``: one arm's numbers as a claim's measure gives
    them."""
    return _arm


def _spread(center: float, width: float = 0.01, n: int = 5) -> list[float]:
    return [center + width * (i - (n - 1) / 2) for i in range(n)]


@pytest.fixture
def spread() -> Callable[..., list[float]]:
    """``spread(center, width=0.01, n=5)``: ``n`` per-seed numbers around ``center``, ``width`` apart (seed
    noise, never none)."""
    return _spread


def _holding(verdict: Any) -> list[bool]:
    return [t["outcome"] == "holds" for t in verdict.checks]


@pytest.fixture
def threshold() -> Callable[..., None]:
    """``threshold(verdict_fn, inside, outside, index)``: test ``index`` holds on ``inside`` and not on
    ``outside`` (numbers just either side of its tolerance), and no other test changes between them."""

    def check(fn: Callable[[Any], Any], inside: Any, outside: Any, index: int) -> None:
        a, b = _holding(fn(inside)), _holding(fn(outside))
        assert a[index] and not b[index], (fn(inside).checks[index], fn(outside).checks[index])
        assert a[:index] + a[index + 1 :] == b[:index] + b[index + 1 :]

    return check
