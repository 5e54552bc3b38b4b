"""The committed claims record (benchmarks/results/claims.json), which the docs render, is a full run
of the registry as it is now: a change to a claim's text, setups, sizes or thresholds without a new
run (`make results`) fails here instead of leaving the docs describing another experiment."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from blocklab.lab.claims import CLAIMS, schema
from blocklab.lab.claims.base import combine
from blocklab.lab.claims.runner import clean

RECORD = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "claims.json"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def test_the_record_is_a_full_run_of_every_claim(record):
    jsonschema.validate(record, schema())
    assert record["mode"] == "full"
    assert [c["name"] for c in record["claims"]] == [c.name for c in CLAIMS]


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
    assert {k: got[k] for k in stated} == stated, "the registry changed since the record: run `make results`"
    for setup, recorded in zip(claim.setups, got["setups"], strict=True):
        assert {k: recorded[k] for k in setup.to_dict()} == setup.to_dict()


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.name)
def test_the_recorded_verdicts_follow_from_the_recorded_numbers(record, claim):
    """The thresholds today, applied to the numbers the run measured, give the verdicts it recorded."""
    got = next(c for c in record["claims"] if c["name"] == claim.name)
    for setup in got["setups"]:
        verdict = claim.verdict(setup["measurements"])
        assert (setup["verdict"], setup["checks"], setup["controls"], setup["observations"]) == (
            verdict.verdict, verdict.checks, verdict.controls, verdict.observations), setup["name"]
        assert setup["headline"] == claim.headline(setup["measurements"])
    assert (got["verdict"], got["reason"]) == combine({s["name"]: s["verdict"] for s in got["setups"]})


@pytest.mark.parametrize("claim", [c for c in CLAIMS if c.kind != "exact"], ids=lambda c: c.name)
def test_every_measured_claim_has_notes_on_its_numbers(record, claim):
    """Issue 25: every note is written from the run; a training or init claim without one says nothing
    about what its setups disagree on or why."""
    assert len(claim.notes) > 80, claim.name
