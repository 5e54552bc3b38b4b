"""Shared by the claim tests: checking that a threshold sits where its sentence says."""

from collections.abc import Callable
from typing import Any

import pytest

from blocklab.lab.claims import Verdict


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
