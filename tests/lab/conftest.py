"""Shared by the lab's tests: every claim at a tiny size (``TINY``, what ``--quick`` runs in the tests)."""

import dataclasses

import pytest

from blocklab.lab.claims import CLAIMS, registry

# Every claim's quick sizes with the training runs cut to 10 steps: generated from the registry, so a new
# claim is covered without a line here.
SHRINK = {"steps": 10, "eval_every": 5, "warmup": 2}
TINY = {c.name: {**c.quick, **{k: v for k, v in SHRINK.items() if k in c.quick}} for c in CLAIMS}


@pytest.fixture
def tiny_claims(monkeypatch):
    """The registry with every claim's quick sizes shrunk to ``TINY``."""
    shrunk = [dataclasses.replace(c, quick=TINY[c.name]) for c in CLAIMS]
    monkeypatch.setattr(registry, "CLAIMS", shrunk)
    monkeypatch.setattr(registry, "REGISTRY", {c.name: c for c in shrunk})
    return shrunk
