"""The registry: every claim, in the order they are run and shown, built from the claim modules;
the runner and the HTML page bound to it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..executors import Executor
from ..grid import MAX_RUNS
from . import (
    attention_distance,
    attention_overwrite,
    embedding_gradient,
    expansion_ratio,
    ffn_share,
    gamma_beta_undo,
    gelu_approximations,
    gelu_dead_neurons,
    gelu_vs_relu,
    glu_variants,
    identity_block,
    layernorm_invariance,
    layernorm_moments,
    layernorm_vs_batchnorm,
    layernorm_whitens,
    no_residual_depth,
    norm_lr_robustness,
    param_counts,
    plain_gradient,
    post_norm_gradient,
    pre_norm_depth,
    pre_norm_gradient,
    pre_norm_small_data,
    pre_vs_post_warmup,
    relu_sparsity,
    residual_formula,
    residual_gradient,
    residual_growth,
    rmsnorm_cost,
    rmsnorm_vs_layernorm,
    runner,
    views,
)
from .base import Claim

MODULES = (
    residual_gradient,
    plain_gradient,
    post_norm_gradient,
    pre_norm_gradient,
    embedding_gradient,
    residual_growth,
    layernorm_moments,
    layernorm_invariance,
    gelu_approximations,
    param_counts,
    ffn_share,
    residual_formula,
    identity_block,
    gamma_beta_undo,
    attention_overwrite,
    layernorm_whitens,
    attention_distance,
    relu_sparsity,
    gelu_vs_relu,
    gelu_dead_neurons,
    glu_variants,
    expansion_ratio,
    no_residual_depth,
    pre_vs_post_warmup,
    norm_lr_robustness,
    pre_norm_depth,
    pre_norm_small_data,
    layernorm_vs_batchnorm,
    rmsnorm_vs_layernorm,
    rmsnorm_cost,
)
CLAIMS: list[Claim] = [module.CLAIM for module in MODULES]
REGISTRY: dict[str, Claim] = {c.name: c for c in CLAIMS}


def select(names: list[str] | None) -> list[Claim]:
    """The named claims (all for None), in registry order; ValueError naming unknown ones."""
    return runner.select(CLAIMS, names)


def with_seeds(claims: list[Claim], seeds: int | None, quick: bool) -> list[Claim]:
    """``claims`` with ``seeds`` seeds wherever their sizes have seeds (None: as they are); ValueError when
    none of them is measured over seeds, so the number would apply to nothing."""
    if seeds is None:
        return claims
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds={seeds!r} must be an integer >= 1")
    takes = [c.name for c in claims if "seeds" in c.params(quick)]
    if not takes:
        raise ValueError(
            f"--seeds {seeds} applies to claims measured over seeds; "
            f"none of {', '.join(c.name for c in claims)} is"
        )
    size = "quick" if quick else "full"
    with_n = lambda c, n: dataclasses.replace(c, **{size: {**c.params(quick), "seeds": n}})
    runs = 0  # counted from 1 and 2 seeds: planning the runs of 10**11 seeds would fill the memory (F7)
    for claim in claims:
        one, two = (
            (_runs(with_n(claim, 1), quick), _runs(with_n(claim, 2), quick))
            if claim.name in takes
            else (_runs(claim, quick), _runs(claim, quick))
        )
        runs += one + (seeds - 1) * (two - one)
    if runs > MAX_RUNS:
        raise ValueError(
            f"--seeds {seeds:,} makes {runs:,} training runs; at most {MAX_RUNS:,} are planned "
            "at once (as in ablate's grids): ask for fewer seeds"
        )
    return [with_n(c, seeds) if c.name in takes else c for c in claims]


def _runs(claim: Claim, quick: bool) -> int:
    """The training runs a claim plans (each seed's runs are alike: the count grows linearly with seeds)."""
    return sum(len(claim.runs(claim.params(quick), s)) for s in claim.setups) if claim.runs else 0


def run_claims(
    names: list[str] | None = None,
    quick: bool = False,
    executor: Executor | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    seeds: int | None = None,
) -> dict[str, Any]:
    """Run every setup of the named claims (all for None); the JSON-ready report (``schema()``).
    ``executor``: where training runs go (default: local worker processes); ``out``: a folder that
    keeps finished runs, so running again continues an interrupted run (``runner.run_claims``);
    ``seeds``: the number of seeds of every claim measured over seeds (None: each claim's own)."""
    return runner.run_claims(with_seeds(select(names), seeds, quick), quick, executor, out, progress)


def claims_html(report: dict[str, Any]) -> str:
    """The report as a self-contained HTML page, a plot per setup."""
    return views.claims_html(report, lambda name: REGISTRY[name].plot)
