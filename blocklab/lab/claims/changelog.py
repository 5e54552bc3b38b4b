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

ISSUE_36_WHAT = (
    "Every verdict is a rule of lab.statistics fixed before the runs: a paired effect over 5 seeds with a "
    "95% t interval, one rule per word (beats, matches, at least, differs, needs; exact for arithmetic), "
    "margins from the source's words or the seed noise of a null arm, a sensitivity label, the source setup "
    "deciding. Compound claims split into one sentence each (pre-vs-post-gradient into post-norm-gradient "
    "and pre-norm-gradient; residual-gradient and plain-gradient; layernorm-vs-batchnorm and "
    "layernorm-invariance; rmsnorm-vs-layernorm and rmsnorm-cost; gelu-vs-relu's cost became an "
    "observation). Sweeps: warmup over 4 learning rates with the source's init and GPT-2's, the source's own "
    "1e-3 restored as the source setup; normalization over 5 learning rates at 6 layers without and with "
    "warmup and clipping. New claims for the tutorials' testable statements: ffn-share, residual-formula, "
    "identity-block, gamma-beta-undo, attention-overwrite, layernorm-whitens, attention-distance, "
    "embedding-gradient, residual-growth, gelu-dead-neurons, expansion-ratio, pre-norm-small-data. Every "
    "training setting recorded per setup."
)
ISSUE_36_WHY = (
    "An independent review would not sign 7 of the 14 verdicts: thresholds were chosen per claim, rules and "
    "setups changed after results were seen, a confound decided claims whose source setup was inconclusive, "
    "training settings were unrecorded, the run cache ignored the code version, and compound claims were "
    "scored on half their words."
)

CHANGES: tuple[Change, ...] = (
    Change(
        date="2026-11-27",
        issue="#36",
        registry="900733d40e21da42",
        what=ISSUE_36_WHAT,
        why=ISSUE_36_WHY,
        before=ISSUE_36_BEFORE,
        after={
            "residual-gradient": "depends",
            "plain-gradient": "fails",
            "post-norm-gradient": "depends",
            "pre-norm-gradient": "fails",
            "embedding-gradient": "fails",
            "residual-growth": "fails",
            "layernorm-moments": "holds",
            "layernorm-invariance": "holds",
            "gelu-approximations": "holds",
            "param-counts": "holds",
            "ffn-share": "fails",
            "residual-formula": "fails",
            "identity-block": "holds",
            "gamma-beta-undo": "fails",
            "attention-overwrite": "fails",
            "layernorm-whitens": "fails",
            "attention-distance": "holds",
            "relu-sparsity": "holds",
            "gelu-vs-relu": "inconclusive",
            "gelu-dead-neurons": "fails",
            "glu-variants": "fails",
            "expansion-ratio": "holds",
            "no-residual-depth": "holds",
            "pre-vs-post-warmup": "inconclusive",
            "norm-lr-robustness": "inconclusive",
            "pre-norm-depth": "holds",
            "pre-norm-small-data": "fails",
            "layernorm-vs-batchnorm": "fails",
            "rmsnorm-vs-layernorm": "holds",
            "rmsnorm-cost": "depends",
        },
    ),
)
