"""Shared by the claim tests: checking that a threshold sits where its sentence says."""

from collections.abc import Callable
from typing import Any

import pytest

from blocklab.lab.claims import Verdict
from blocklab.lab.claims.shared import outcome


def _oks(verdict: Verdict) -> list[bool]:
    return [c["ok"] for c in verdict.checks]


@pytest.fixture
def threshold() -> Callable[..., None]:
    """``threshold(verdict_fn, inside, outside, index)``: check ``index`` holds on ``inside`` and not on
    ``outside`` (numbers just either side of its threshold), and no other check changes between them."""

    def check(fn: Callable[[Any], Verdict], inside: Any, outside: Any, index: int) -> None:
        a, b = _oks(fn(inside)), _oks(fn(outside))
        assert a[index] and not b[index], (fn(inside).checks[index], fn(outside).checks[index])
        assert a[:index] + a[index + 1 :] == b[:index] + b[index + 1 :]

    return check


def _arm(
    accuracy: list[float | None], steps: list[int | None] | None = None, budget: int = 600
) -> dict[str, Any]:
    """One arm's per-seed numbers as ``shared.outcome`` gives them: ``accuracy`` per seed (None: diverged);
    ``steps`` to the target per seed (default: 100 where the accuracy is at least 0.99, else not reached)."""
    runs = [
        {
            "accuracy": 0.0 if a is None else a,
            "diverged": a is None,
            "curve": [{"step": reach, "eval_accuracy": 0.99}] if reach is not None else [],
            "spec": {"train": {"steps": budget}},
        }
        for a, reach in zip(accuracy, steps if steps is not None else [
            100 if a is not None and a >= 0.99 else None for a in accuracy], strict=True)
    ]
    return outcome(runs)


@pytest.fixture
def arm() -> Callable[..., dict[str, Any]]:
    """``arm(accuracy per seed, steps per seed=None)``: one arm's numbers as a claim's measure gives them."""
    return _arm
