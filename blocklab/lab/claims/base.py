"""What a claim is made of: its source, its setups, its measurement, its tests and verdicts.

A ``Claim`` tests one sentence of a paper or tutorial (``statement``, quoted in ``Source`` with the
citation, the section, the words the test reads and the setup the source used), how blocklab measures it
(``method``) and the ``Setup``s it is measured in: one as close to the source as fits this machine (role
``source``), others that vary what could confound it (role ``confound``: position code, init scheme) and
others that move the condition the claim names (role ``sweep``: learning rates, depths). Exact claims
(arithmetic, counts) have one setup of role ``exact``: nothing about them can be confounded.

For each setup the claim's ``measure`` returns plain numbers and its ``verdict`` turns them into
``Test``s: each a rule of ``lab.statistics`` (``beats``, ``matches``, ``needs`` on a paired effect over
seeds with a 95% interval, or ``exact`` within float rounding) with its outcome, its margin and where the
margin comes from, and its outcome under neighbouring choices (the sensitivity). A setup holds when every
test holds, fails when one fails, and is inconclusive otherwise, or when a control failed (the arm that
must train did not): its tests are still shown, but they say nothing. What goes beyond the source is an
*observation*, shown beside the verdict and never inside it.

The claim's verdict is its source setup's (``combine``): a confound or a sweep never decides it. When the
source setup is conclusive and a conclusive confound disagrees, the claim ``depends``; the sweep's
verdicts are shown along their condition and change nothing. The rules are the same for every claim
(``lab.statistics``); a claim's module chooses only its numbers, its arms and its margins' origin.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from matplotlib.figure import Figure

from ...nn.config import FIELDS, ModelConfig
from ...nn.init_schemes import INIT_SCHEMES
from ...training.train_config import TRAIN_FIELDS
from ..grid import RunSpec
from ..statistics import OUTCOMES

CONCLUSIVE = ("holds", "fails")
VERDICTS = OUTCOMES  # a test's and a setup's: holds, fails or inconclusive
OVERALL = (*VERDICTS, "depends")  # a claim's: "depends" when a conclusive confound disagrees with the source
# exact: arithmetic or counts; init: at initialization (or timing, no training); pretrained: a shipped model
KINDS = ("exact", "init", "pretrained", "training")
ROLES = ("source", "confound", "sweep", "exact")
# lab.statistics' words ("differs": the negation of "matches", on the same interval and margin), and
# exact arithmetic
RULE_WORDS = ("beats", "matches", "at least", "differs", "needs", "exact")
# what a source's setup states, in this order (a missing item is "not stated")
SOURCE_SETUP_KEYS = ("depth", "width", "init", "positions", "lr", "warmup", "steps")


MODEL_DEFAULT_INIT: str = ModelConfig.__dataclass_fields__["init"].default  # blocklab's: "torch"

Numbers = dict[str, Any]  # a setup's measurements: plain, JSON-ready
Results = dict[str, dict[str, Any]]  # finished training runs by RunSpec key


@dataclass(frozen=True)
class Test:
    """One rule applied to one setup's numbers: the words it reads (``check``), the rule (RULE_WORDS),
    its outcome, the paired effect and margin it was decided on (None for exact arithmetic: ``effect``
    then holds the numbers compared), and its outcome under each neighbouring choice (``neighbours``:
    the margin halved and doubled, the runs read one evaluation earlier or at half their budget)."""

    check: str
    rule: str
    outcome: str
    effect: dict[str, Any] | None
    margin: dict[str, Any] | None
    neighbours: dict[str, str]

    def __post_init__(self) -> None:
        if self.rule not in RULE_WORDS:
            raise ValueError(f"Test.rule={self.rule!r} is not one of: {', '.join(RULE_WORDS)}")
        if self.outcome not in OUTCOMES or not set(self.neighbours.values()) <= set(OUTCOMES):
            raise ValueError(f"a test's outcomes are: {', '.join(OUTCOMES)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """One setup's outcome: ``verdict`` in VERDICTS, ``reason`` in words, every test (``checks``), the
    controls, the observations and the sensitivity (the verdict under each neighbouring choice)."""

    verdict: str
    reason: str
    checks: list[dict[str, Any]]  # Test.to_dict()
    controls: list[dict[str, Any]] = field(default_factory=list)  # {"check": sentence, "ok": bool}
    observations: list[str] = field(default_factory=list)  # beyond the source: shown, never scored
    sensitivity: dict[str, Any] = field(default_factory=dict)  # {"label", "neighbours", "flips"}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def setup_verdict(outcomes: Sequence[str]) -> str:
    """A setup's verdict from its tests' outcomes: holds when all hold, fails when one fails, else
    inconclusive."""
    if "fails" in outcomes:
        return "fails"
    return "holds" if all(o == "holds" for o in outcomes) else "inconclusive"


def sensitivity_of(verdict: str, tests: Sequence[Test]) -> dict[str, Any]:
    """The setup's verdict recomputed under each neighbouring choice any test names (a test without that
    neighbour keeps its own outcome); ``robust`` when none changes it."""
    names = list(dict.fromkeys(n for t in tests for n in t.neighbours))
    again = {n: setup_verdict([t.neighbours.get(n, t.outcome) for t in tests]) for n in names}
    flips = [n for n, v in again.items() if v != verdict]
    return {"label": "fragile" if flips else "robust", "neighbours": again, "flips": flips}


def from_tests(
    tests: Sequence[Test],
    controls: Sequence[tuple[str, bool]] = (),
    observations: Sequence[str] = (),
) -> Verdict:
    """The setup's verdict (``setup_verdict``) with a reason naming the tests by outcome; inconclusive
    when any control is false (the setup cannot test the claim: the arm that must train did not);
    ``observations`` ride along unscored."""
    if not tests:
        raise ValueError("a verdict needs at least one test")
    verdict = setup_verdict([t.outcome for t in tests])
    parts = [
        f"{word}: " + "; ".join(t.check for t in tests if t.outcome == outcome)
        for outcome, word in (("holds", "holds"), ("fails", "fails"), ("inconclusive", "undecided"))
        if any(t.outcome == outcome for t in tests)
    ]
    reason = "; ".join(parts)
    broken = [text for text, ok in controls if not ok]
    if broken:
        verdict, reason = (
            "inconclusive",
            "a control failed (" + "; ".join(broken) + "), so the tests do not count",
        )
    return Verdict(
        verdict,
        reason,
        [t.to_dict() for t in tests],
        [{"check": t, "ok": bool(ok)} for t, ok in controls],
        list(observations),
        sensitivity_of(verdict, tests) if not broken else {"label": "robust", "neighbours": {}, "flips": []},
    )


def seed_count(oks: list[bool]) -> tuple[bool, str]:
    """A control's rule over seeds: true when true on more than half of the seeds (3 of 5); the words say
    how many. Controls only: a claim's own test is a paired effect with an interval (``lab.statistics``)."""
    if not oks:
        raise ValueError("a count over seeds needs at least one seed")
    k, n = sum(bool(ok) for ok in oks), len(oks)
    return 2 * k > n, f"{k} of {n} seeds"


def combine(setups: Sequence[tuple[str, str, str]]) -> tuple[str, str]:
    """The claim's verdict from its setups' (name, role, verdict), and a sentence saying it: the source
    (or exact) setup's verdict decides; ``depends`` when it is conclusive and a conclusive confound
    disagrees; a sweep's verdicts are named and decide nothing, and an inconclusive source setup makes
    the claim inconclusive whatever the confounds say."""
    if not setups:
        raise ValueError("a claim needs at least one setup's verdict")
    unknown = sorted({v for _, _, v in setups} - set(VERDICTS))
    if unknown:
        raise ValueError(f"setup verdict {unknown[0]!r} is not one of: {', '.join(VERDICTS)}")
    deciding = [(n, v) for n, r, v in setups if r in ("source", "exact")]
    if len(deciding) != 1:
        raise ValueError("a claim has exactly one source (or exact) setup, which decides it")
    ((source, verdict),) = deciding
    if len(setups) == 1:
        return verdict, f"{verdict} in its only setup"
    others = {role: [(n, v) for n, r, v in setups if r == role] for role in ("confound", "sweep")}
    said = lambda items: ", ".join(f"{n} {v}" for n, v in items)
    tail = "".join(f"; {role}s: {said(items)}" for role, items in others.items() if items)
    if verdict == "inconclusive":
        return (
            "inconclusive",
            f"the source setup ({source}) is inconclusive, and no other setup decides in its place{tail}",
        )
    against = [n for n, v in others["confound"] if v in CONCLUSIVE and v != verdict]
    if against:
        return (
            "depends",
            f"{verdict} in the source setup ({source}), the opposite in {', '.join(against)}{tail}",
        )
    return verdict, f"{verdict} in the source setup ({source}){tail}"


@dataclass(frozen=True)
class Source:
    """Where a claim comes from: the text, the place in it, the sentence it tests (quoted), which of its
    words the test reads, and the setup the source used."""

    citation: str  # authors, year, title (or the tutorial's name and file)
    section: str  # section, figure, equation
    statement: str  # the sentence tested, quoted
    reads: str  # the words of it the test reads, and how
    setup: dict[str, str] = field(default_factory=dict)  # SOURCE_SETUP_KEYS -> what the source used

    def __post_init__(self) -> None:
        unknown = sorted(set(self.setup) - set(SOURCE_SETUP_KEYS))
        if unknown:
            raise ValueError(f"Source.setup key {unknown[0]!r} is not one of: {', '.join(SOURCE_SETUP_KEYS)}")
        if not self.reads.strip():
            raise ValueError(f"Source {self.citation!r}: say which words of the sentence the test reads")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, setup items in SOURCE_SETUP_KEYS order ("not stated" where missing)."""
        return {
            "citation": self.citation,
            "section": self.section,
            "statement": self.statement,
            "reads": self.reads,
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

    def but(
        self, name: str, why: str, init: str | None = None, role: str = "confound", **parts: dict[str, Any]
    ) -> Setup:
        """A confound (or, with ``role="sweep"``, a point of a sweep) of this setup: the same, but for
        ``init`` and the ``model`` / ``train`` fields given."""
        return Setup(
            name,
            role,
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
        elif (
            roles.count("source") != 1
            or "exact" in roles
            or (self.kind == "training" and "confound" not in roles)
        ):
            raise ValueError(
                f"Claim {self.name!r}: a {self.kind} claim has one 'source' setup"
                + (" and at least one 'confound'" if self.kind == "training" else "")
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

    def setups_run(self, quick: bool) -> tuple[Setup, ...]:
        """The setups a run measures: every one in the full run, the deciding one in the quick smoke run."""
        return tuple(s for s in self.setups if s.role in ("source", "exact")) if quick else self.setups

    def setup(self, name: str) -> Setup:
        """The setup called ``name``."""
        return next(s for s in self.setups if s.name == name)
