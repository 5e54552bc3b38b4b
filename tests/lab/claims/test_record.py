"""The committed claims record (benchmarks/results/claims.json), which the docs render, is a full run of the
registry as it is now: its registry hash is the registry's, the last changelog entry names that hash and the
record's verdicts, and every verdict, test, interval, margin and its origin, sensitivity label and training
setting follows from the recorded per-seed numbers and the registry (issue 36). A change to a claim's
sentence, setups, sizes, rules or settings without a changelog entry and a full rerun (`make results`)
fails here instead of leaving the docs describing another experiment."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from blocklab.lab.claims import CLAIMS, schema
from blocklab.lab.claims.base import combine
from blocklab.lab.claims.changelog import CHANGES
from blocklab.lab.claims.runner import clean, registry_hash, training_settings

RECORD = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "claims.json"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def test_the_record_is_a_full_run_of_every_claim_of_this_registry(record):
    jsonschema.validate(record, schema())
    assert record["mode"] == "full" and "warning" not in record
    assert [c["name"] for c in record["claims"]] == [c.name for c in CLAIMS]
    assert record["registry"] == registry_hash(CLAIMS), (
        "the registry changed since the record: add a "
        "changelog entry (blocklab/lab/claims/changelog.py) and run `make results`"
    )


def test_the_last_changelog_entry_is_this_records():
    assert CHANGES, "the record follows a change: blocklab/lab/claims/changelog.py names it"
    record = json.loads(RECORD.read_text())
    last = CHANGES[-1]
    assert last.registry == record["registry"]
    assert last.after == {c["name"]: c["verdict"] for c in record["claims"]}
    assert all(c.what and c.why and c.before for c in CHANGES)


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.name)
def test_the_record_measured_the_claim_as_the_registry_states_it(record, claim):
    got = next(c for c in record["claims"] if c["name"] == claim.name)
    stated = {
        "kind": claim.kind,
        "statement": claim.statement,
        "source": claim.source.to_dict(),
        "method": claim.method,
        "notes": claim.notes,
        "params": clean(claim.full),
    }
    assert {k: got[k] for k in stated} == stated
    for setup, recorded in zip(claim.setups, got["setups"], strict=True):
        assert {k: recorded[k] for k in setup.to_dict()} == setup.to_dict()
        runs = claim.runs(claim.full, setup) if claim.runs else []
        assert recorded["runs"] == len(runs)
        assert recorded["training"] == clean(training_settings(runs))  # every setting, as the runs trained


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.name)
def test_the_recorded_verdicts_follow_from_the_recorded_numbers(record, claim):
    """The rules today, applied to the per-seed numbers the run measured, give the verdicts, tests (effects,
    intervals, margins and their origin), controls and sensitivity it recorded."""
    got = next(c for c in record["claims"] if c["name"] == claim.name)
    for setup in got["setups"]:
        verdict = clean(claim.verdict(setup["measurements"]).to_dict())
        assert {k: setup[k] for k in verdict} == verdict, setup["name"]
        assert setup["headline"] == claim.headline(setup["measurements"])
    assert (got["verdict"], got["reason"]) == combine(
        [(s["name"], s["role"], s["verdict"]) for s in got["setups"]]
    )
    deciding = next(s for s in got["setups"] if s["role"] in ("source", "exact"))
    assert got["sensitivity"] == deciding["sensitivity"]


@pytest.mark.parametrize("claim", [c for c in CLAIMS if c.kind != "exact"], ids=lambda c: c.name)
def test_every_measured_claim_has_notes_on_its_numbers(claim):
    """Issue 25: every note is written from the run; a training or init claim without one says nothing
    about what its setups disagree on or why."""
    assert len(claim.notes) > 80, claim.name
