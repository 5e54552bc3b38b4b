"""The record's changelog: every change to a rule, a setup or a claim after results existed, with why, and
the verdicts before and after. A change is allowed only with an entry here and a full rerun: the committed
record's registry hash must be the last entry's, and its verdicts the entry's ``after``
(tests/lab/claims/test_record.py), so a registry edited without both fails the suite.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Change:
    """One change to the registry after results existed."""

    date: str  # YYYY-MM-DD
    issue: str  # where it was asked for and reviewed
    registry: str  # the registry's hash after the change (runner.registry_hash)
    what: str
    why: str
    before: dict[
        str, str
    ]  # claim -> its verdict in the record before (claims renamed or split: as they were)
    after: dict[str, str]  # claim -> its verdict in the full rerun that followed

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


ISSUE_36_BEFORE = {
    "residual-gradient": "partly",
    "pre-vs-post-gradient": "depends",
    "layernorm-moments": "holds",
    "gelu-approximations": "holds",
    "param-counts": "holds",
    "relu-sparsity": "holds",
    "gelu-vs-relu": "depends",
    "glu-variants": "holds",
    "no-residual-depth": "holds",
    "pre-vs-post-warmup": "partly",
    "norm-lr-robustness": "fails",
    "pre-norm-depth": "depends",
    "layernorm-vs-batchnorm": "holds",
    "rmsnorm-vs-layernorm": "holds",
}

CHANGES: tuple[Change, ...] = ()
