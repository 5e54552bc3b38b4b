"""Shared by the lab's tests: every claim at a tiny size (``TINY``, what ``--quick`` runs in the tests)."""

import dataclasses

import pytest

from blocklab.lab.claims import CLAIMS, registry

TRAIN_TINY = {
    "d_model": 16, "steps": 10, "lr": 1e-2, "warmup": 2, "batch_size": 16, "eval_every": 5, "seeds": 1,
}  # fmt: skip
TINY = {
    "residual-gradient": {"d_model": 16, "batch": 8, "depths": [2, 4], "seeds": 1},
    "pre-vs-post-gradient": {"d_model": 16, "batch": 8, "depths": [3, 6], "seeds": 1},
    "layernorm-moments": {"d_model": 64, "n": 64, "input_vars": [1.0, 0.01186, 1e-5]},
    "gelu-approximations": {"points": 20_001},
    "param-counts": {},
    "relu-sparsity": {**TRAIN_TINY, "seeds": 2},
    "gelu-vs-relu": {**TRAIN_TINY, "timing": [32, 64, 3]},
    "no-residual-depth": {**TRAIN_TINY, "depths": [1, 2], "trains_at": 0.3, "fails_below": 0.15},
    "pre-vs-post-warmup": {**TRAIN_TINY, "depth": 2},
    "norm-lr-robustness": {**TRAIN_TINY, "lrs": [1e-3, 1e-2], "trains_at": 0.3},
    "pre-norm-depth": {**TRAIN_TINY, "depths": [1, 2], "trains_at": 0.3},
    "layernorm-vs-batchnorm": {**TRAIN_TINY, "batch": 4, "batch_sizes": [1, 8]},
    "glu-variants": {**TRAIN_TINY, "batch_size": 4},
    "rmsnorm-vs-layernorm": {**TRAIN_TINY, "timing": [16, 32, 3]},
}


@pytest.fixture
def tiny_claims(monkeypatch):
    """The registry with every claim's quick sizes shrunk to ``TINY``."""
    shrunk = [dataclasses.replace(c, quick=TINY[c.name]) for c in CLAIMS]
    monkeypatch.setattr(registry, "CLAIMS", shrunk)
    monkeypatch.setattr(registry, "REGISTRY", {c.name: c for c in shrunk})
    return shrunk
