"""What a claim is made of: its source, its setups, its measurement, its checks and verdicts.

A ``Claim`` states what a paper or tutorial says (``statement``), where (``Source``: citation,
section, and the setup the source used), how blocklab measures it (``method``), and the
``Setup``s it is measured in: one as close to the source as fits this machine (role
``source``) and others that vary what could confound it (role ``confound``: position code,
embedding scale, init scheme, learning rate). Exact claims (arithmetic, counts) have one
setup of role ``exact``: nothing about them can be confounded.

For each setup the claim's ``measure`` returns plain numbers and its ``verdict`` turns them
into named checks: all true ``holds``, none ``fails``, some ``partly``. A setup whose controls
fail (the arm that must train does not, both arms at chance) is ``inconclusive``: its checks are
still shown, but they say nothing about the claim. What goes beyond the source is an
*observation*, shown beside the verdict and never inside it. The claim's overall verdict is the
conclusive setups' common verdict, or ``depends`` when they differ (``combine``); an inconclusive
setup never makes a claim ``depends``. Training numbers come from several seeds, and a per-seed
check is a rule over counts (``seed_count``). A verdict is never written in; thresholds live in
each claim's module, taken from the claim's words, as tested functions.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from matplotlib.figure import Figure

from ...nn.config import FIELDS, ModelConfig
from ...nn.init_schemes import INIT_SCHEMES
from ...training.train_config import TRAIN_FIELDS
from ..grid import RunSpec

CONCLUSIVE = ("holds", "partly", "fails")
VERDICTS = (*CONCLUSIVE, "inconclusive")  # one setup's verdict: inconclusive when a control failed
OVERALL = (*VERDICTS, "depends")  # a claim's: "depends" when its conclusive setups disagree
KINDS = ("exact", "init", "training")  # exact: arithmetic or counts; init: at initialization
ROLES = ("source", "confound", "exact")
# what a source's setup states, in this order (a missing item is "not stated")
SOURCE_SETUP_KEYS = ("depth", "width", "init", "positions", "lr", "warmup", "steps")


MODEL_DEFAULT_INIT: str = ModelConfig.__dataclass_fields__["init"].default  # blocklab's: "torch"

Numbers = dict[str, Any]  # a setup's measurements: plain, JSON-ready
Results = dict[str, dict[str, Any]]  # finished training runs by RunSpec key


@dataclass(frozen=True)
class Verdict:
    """One setup's outcome: ``verdict`` in VERDICTS, ``reason`` in words, and every check."""

    verdict: str
    reason: str
    checks: list[dict[str, Any]]  # {"check": sentence, "ok": bool}
    controls: list[dict[str, Any]] = field(default_factory=list)  # {"check": sentence, "ok": bool}
    observations: list[str] = field(default_factory=list)  # beyond the source: shown, never scored

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def from_checks(
    checks: list[tuple[str, bool]],
    controls: list[tuple[str, bool]] | tuple[()] = (),
    observations: list[str] | tuple[()] = (),
) -> Verdict:
    """holds if every check is true, fails if none is, partly otherwise; the reason names them.
    ``inconclusive`` instead when any control is false (the setup cannot test the claim: the arm
    that must train did not, a run diverged where none may); ``observations`` ride along unscored."""
    if not checks:
        raise ValueError("a verdict needs at least one check")
    passed = [text for text, ok in checks if ok]
    failed = [text for text, ok in checks if not ok]
    broken = [text for text, ok in controls if not ok]
    verdict = "holds" if not failed else ("fails" if not passed else "partly")
    parts = [
        ("true: " + "; ".join(passed)) if passed else "",
        ("not true: " + "; ".join(failed)) if failed else "",
    ]
    reason = "; ".join(p for p in parts if p)
    if broken:
        verdict, reason = (
            "inconclusive",
            "a control failed (" + "; ".join(broken) + "), so the checks do not count",
        )
    return Verdict(
        verdict,
        reason,
        [{"check": t, "ok": bool(ok)} for t, ok in checks],
        [{"check": t, "ok": bool(ok)} for t, ok in controls],
        list(observations),
    )


def seed_count(oks: list[bool]) -> tuple[bool, str]:
    """The rule over seeds: a per-seed statement counts as true when it is true on more than half of
    the seeds (2 of 3, 3 of 5); the words say how many it was true on."""
    if not oks:
        raise ValueError("a count over seeds needs at least one seed")
    k, n = sum(bool(ok) for ok in oks), len(oks)
    return 2 * k > n, f"{k} of {n} seeds"


def combine(verdicts: dict[str, str]) -> tuple[str, str]:
    """The overall verdict of per-setup verdicts ({setup: verdict}) and a sentence saying it.
    Inconclusive setups are left out (named in the sentence); all inconclusive: inconclusive."""
    if not verdicts:
        raise ValueError("a claim needs at least one setup's verdict")
    unknown = sorted(set(verdicts.values()) - set(VERDICTS))
    if unknown:
        raise ValueError(f"setup verdict {unknown[0]!r} is not one of: {', '.join(VERDICTS)}")
    left_out = [s for s, v in verdicts.items() if v == "inconclusive"]
    aside = f" ({', '.join(left_out)} inconclusive, left out)" if left_out else ""
    conclusive = {s: v for s, v in verdicts.items() if v != "inconclusive"}
    if not conclusive:
        which = "its only setup" if len(verdicts) == 1 else f"every setup ({', '.join(verdicts)})"
        return "inconclusive", f"inconclusive in {which}: no setup could test the claim"
    distinct = set(conclusive.values())
    if len(distinct) == 1:
        (verdict,) = distinct
        which = (
            "its only setup"
            if len(verdicts) == 1
            else (
                f"every setup ({', '.join(conclusive)})"
                if not left_out
                else f"every conclusive setup ({', '.join(conclusive)})"
            )
        )
        return verdict, f"{verdict} in {which}{aside}"
    by_verdict = {v: [s for s, sv in conclusive.items() if sv == v] for v in CONCLUSIVE if v in distinct}
    return "depends", "the verdict depends on the setup: " + "; ".join(
        f"{v} in {', '.join(setups)}" for v, setups in by_verdict.items()
    ) + aside


@dataclass(frozen=True)
class Source:
    """Where a claim comes from: the text, the place in it, and the setup it used."""

    citation: str  # authors, year, title (or the tutorial's name)
    section: str  # section, figure, equation
    statement: str  # what it says there, in its words or closely paraphrased
    setup: dict[str, str] = field(default_factory=dict)  # SOURCE_SETUP_KEYS -> what the source used

    def __post_init__(self) -> None:
        unknown = sorted(set(self.setup) - set(SOURCE_SETUP_KEYS))
        if unknown:
            raise ValueError(f"Source.setup key {unknown[0]!r} is not one of: {', '.join(SOURCE_SETUP_KEYS)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, setup items in SOURCE_SETUP_KEYS order ("not stated" where missing)."""
        return {
            "citation": self.citation,
            "section": self.section,
            "statement": self.statement,
            "setup": {k: self.setup.get(k, "not stated") for k in SOURCE_SETUP_KEYS},
        }


@dataclass(frozen=True)
class Setup:
    """One setting a claim is measured in: ModelConfig and TrainConfig fields over the claim's
    sizes, and the init scheme of the blocks' linear weights (``INIT_SCHEMES``; blocklab's default
    ``torch`` unless the source used another): training runs are built with it, and models
    measured at init are drawn with it."""

    name: str
    role: str  # ROLES
    why: str  # what this setup is, and what it rules in or out
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields
    init: str = MODEL_DEFAULT_INIT

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Setup {self.name!r}: role={self.role!r} is not one of: {', '.join(ROLES)}")
        for part, allowed, what in (
            (self.model, FIELDS, "ModelConfig"),
            (self.train, TRAIN_FIELDS, "TrainConfig"),
        ):
            unknown = sorted(set(part) - set(allowed))
            if unknown:
                raise ValueError(f"Setup {self.name!r}: {unknown[0]!r} is not a {what} field")
        if "init" in self.model:
            raise ValueError(f"Setup {self.name!r}: the init scheme is the setup's init, not a model field")
        if "seed" in self.train:
            raise ValueError(f"Setup {self.name!r}: seeds are the claim's sizes, not a setup")
        if self.init not in INIT_SCHEMES:
            raise ValueError(
                f"Setup {self.name!r}: init={self.init!r} is not one of: {', '.join(INIT_SCHEMES)}"
            )

    def but(self, name: str, why: str, init: str | None = None, **parts: dict[str, Any]) -> Setup:
        """A confound of this setup: the same, but for ``init`` and the ``model`` / ``train`` fields given."""
        return Setup(
            name,
            "confound",
            why,
            {**self.model, **parts.get("model", {})},
            {**self.train, **parts.get("train", {})},
            self.init if init is None else init,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


Measure = Callable[[dict[str, Any], Setup, Results], Numbers]  # (sizes, setup, finished runs) -> numbers
Runs = Callable[[dict[str, Any], Setup], list[RunSpec]]  # (sizes, setup) -> training runs


@dataclass(frozen=True)
class Claim:
    """A named, reproducible experiment about the block, measured in each of its setups."""

    name: str
    kind: str  # KINDS
    statement: str  # what the source (or the tutorials) say
    source: Source
    method: str  # how blocklab measures it
    setups: tuple[Setup, ...]
    quick: dict[str, Any]  # sizes of the quick run
    full: dict[str, Any]  # ... and of the full run
    measure: Measure
    verdict: Callable[[Numbers], Verdict]  # one setup's numbers -> its verdict
    headline: Callable[[Numbers], str]  # one setup's key numbers in one line
    plot: Callable[[Numbers, Figure], None]  # one setup's figure
    runs: Runs | None = None  # training runs of one setup (training claims only)
    notes: str = ""  # what the numbers say, what changed from an earlier record and why

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Claim {self.name!r}: kind={self.kind!r} is not one of: {', '.join(KINDS)}")
        names = [s.name for s in self.setups]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"Claim {self.name!r}: setups must be at least one, with distinct names")
        roles = [s.role for s in self.setups]
        if self.kind == "exact":
            if roles != ["exact"]:
                raise ValueError(f"Claim {self.name!r}: an exact claim has one setup, of role 'exact'")
        elif roles.count("source") != 1 or "confound" not in roles or "exact" in roles:
            raise ValueError(
                f"Claim {self.name!r}: a {self.kind} claim has one 'source' setup and at least one 'confound'"
            )
        if (self.kind == "training") != (self.runs is not None):
            raise ValueError(f"Claim {self.name!r}: training claims, and only they, have runs")

    @classmethod
    def of(cls, module: str, **fields: Any) -> Claim:
        """The claim a module states (``module``: its ``__name__``): the module's functions ``measure``,
        ``verdict``, ``headline``, ``plot`` and, for a training claim, ``runs`` go in by name, so a claim
        file writes only what is its own."""
        functions = vars(sys.modules[module])
        parts = {name: functions[name] for name in ("measure", "verdict", "headline", "plot")}
        return cls(**fields, **parts, runs=functions.get("runs"))

    def params(self, quick: bool) -> dict[str, Any]:
        """The sizes of the quick or the full run."""
        return self.quick if quick else self.full

    def setup(self, name: str) -> Setup:
        """The setup called ``name``."""
        return next(s for s in self.setups if s.name == name)
