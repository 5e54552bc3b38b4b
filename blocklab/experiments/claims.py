"""``blocklab claims``: what the textbooks say about the block, measured on this machine.

Each ``Claim`` states the textbook claim, how it is measured, its sizes (``quick`` and ``full``),
the training runs it needs (``runs``, none for claims about initialization), a ``measure`` that
returns plain numbers, a ``verdict`` computed from those numbers only (``verdicts.py``), a short
``headline`` of the key numbers and a ``plot``. ``run_claims`` runs the selected claims — their
training runs in parallel worker processes — and returns a JSON-ready report that
``claims_table`` and ``claims_html`` show.
"""

from __future__ import annotations

import html
import json
import math
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
from matplotlib.figure import Figure

from . import init_claims as init
from . import plots, verdicts
from . import training_claims as trained
from .runs import RunSpec, default_jobs, run_many
from .verdicts import Verdict


@dataclass(frozen=True)
class Claim:
    """A named, reproducible experiment about the block."""

    name: str
    claim: str  # what the textbooks say
    method: str  # how it is measured here
    quick: dict[str, Any]  # size parameters of the quick run
    full: dict[str, Any]  # ... and of the full run
    measure: Callable[..., dict[str, Any]]  # (p) or, with runs, (p, results) -> numbers
    verdict: Callable[[dict[str, Any]], Verdict]
    headline: Callable[[dict[str, Any]], str]  # the key numbers in one line
    plot: Callable[[dict[str, Any], Figure], None]
    runs: Callable[[dict[str, Any]], list[RunSpec]] | None = None  # training runs needed, if any

    def params(self, quick: bool) -> dict[str, Any]:
        """The size parameters of the quick or the full run."""
        return self.quick if quick else self.full


def _pct(xs: list[float | None]) -> str:
    return " ".join("div" if x is None else f"{100 * x:.0f}%" for x in xs)


def _g(x: float) -> str:
    return f"{x:.2g}"


# Quick: a 200-step budget at d_model 32, where "trains" means clearly above chance (10% on listops).
_TRAIN_QUICK = {"d_model": 32, "steps": 200, "lr": 1e-2, "warmup": 50, "batch_size": 64}
_TRAIN_FULL = {"d_model": 64, "steps": 600, "lr": 3e-3, "warmup": 50, "batch_size": 64}

CLAIMS: list[Claim] = [
    Claim(
        "residual-gradient",
        "Residual connections keep gradients alive (the +1 term): without them the gradient reaching the "
        "first layer of a deep stack vanishes.",
        "At initialization, on a listops batch: |dL/dx_0| / |dL/dx_N| (residual-stream gradient at the "
        "first block's input over the gradient entering the stack from above), with residual add and none, "
        "for post-norm, pre-norm and norm-free stacks; plus the identity- and branch-path shares at each "
        "residual connection (SPEC 1).",
        {"d_model": 32, "batch": 16, "depths": [2, 6, 10, 20], "seeds": 1},
        {"d_model": 64, "batch": 64, "depths": [2, 6, 10, 20], "seeds": 3},
        init.measure_residual_gradient,
        verdicts.residual_gradient,
        lambda m: (
            "depth {}: add {} / none {}".format(
                m["depths"][-1],
                " ".join(_g(f["add"][-1]) for f in m["families"].values()),
                " ".join(_g(f["none"][-1]) for f in m["families"].values()),
            )
            + " (post, pre, no norm)"
        ),
        plots.residual_gradient,
    ),
    Claim(
        "pre-vs-post-gradient",
        "At initialization post-norm's FFN gradient grows with the layer index while pre-norm's stays flat "
        "(Xiong et al. 2020, 'On Layer Normalization in the Transformer Architecture').",
        "Gradient norm of each layer's FFN weights (W1 and W2) at init, post- and pre-norm stacks, with "
        "blocklab's N(0, 0.02) init and with Xavier-normal init as in the paper; growth = geometric mean "
        "of the last third of the layers over the first third, averaged over seeds.",
        {"d_model": 32, "batch": 32, "depths": [6, 12, 24], "seeds": 1},
        {"d_model": 64, "batch": 64, "depths": [6, 12, 24], "seeds": 4},
        init.measure_pre_vs_post_gradient,
        verdicts.pre_vs_post_gradient,
        lambda m: (
            "growth at depth {}: ".format(m["depths"][-1])
            + ", ".join(
                f"{init_} post {g['post'][-1]:.2f} pre {g['pre'][-1]:.2f}" for init_, g in m["inits"].items()
            )
        ),
        plots.pre_vs_post_gradient,
    ),
    Claim(
        "layernorm-moments",
        "LayerNorm's output has mean 0 and variance 1.",
        "blocklab's LayerNorm (d=64, eps=1e-5, float64) on positions of known variance; output mean and "
        "(biased) variance against var/(var+eps). The shortfall below 1 is eps's, not a d-1 effect: "
        "(d-1)/d would be 0.984 at every scale.",
        {"d_model": 64, "n": 256, "input_vars": [1.0, 1e-2, 0.01186, 1e-3, 1e-4, 1e-5]},
        {"d_model": 64, "n": 4096, "input_vars": [1.0, 1e-2, 0.01186, 1e-3, 1e-4, 1e-5, 1e-6]},
        init.measure_layernorm_moments,
        verdicts.layernorm_moments,
        lambda m: (
            "var out at var in {}: ".format("/".join(f"{r['input_var']:g}" for r in m["rows"][1:4:2]))
            + " / ".join(f"{r['out_var']:.5f}" for r in m["rows"][1:4:2])
            + f"; max |mean| {max(r['out_mean'] for r in m['rows']):.1e}"
        ),
        plots.layernorm_moments,
    ),
    Claim(
        "gelu-approximations",
        "The tanh and sigmoid approximations of GELU are close to the exact x * Phi(x).",
        "Max |approximation - exact| over [-10, 10] on an evenly spaced float64 grid; close = below 1e-3.",
        {"points": 2_000_001},
        {"points": 20_000_001},
        init.measure_gelu_approximations,
        verdicts.gelu_approximations,
        lambda m: " ".join(f"{k} {v['max_err']:.3g} at {v['at']:.2f}" for k, v in m.items()),
        plots.gelu_approximations,
    ),
    Claim(
        "param-counts",
        "LayerNorm d=64 has 128 parameters, the FFN d=64/d_ff=256 33,088, attention d=64 16,384, and "
        "GPT-2 small (tied embeddings) 124,439,808.",
        "Parameters of the built modules (GPT-2 built on the meta device) against the analytic count "
        "(blocklab.params) and the published figure.",
        {},
        {},
        init.measure_param_counts,
        verdicts.param_counts,
        lambda m: " / ".join(f"{r['built']:,}" for r in m["items"]),
        plots.param_counts,
    ),
    Claim(
        "relu-sparsity",
        "ReLU zeroes about half of the FFN hidden units.",
        "Fraction of FFN pre-activations <= 0 per layer (and of dead units, <= 0 on every position of "
        "the batch) on listops batches at init and after training.",
        _TRAIN_QUICK,
        _TRAIN_FULL,
        trained.measure_relu_sparsity,
        verdicts.relu_sparsity,
        lambda m: (
            f"init {_pct(m['init'])}, trained {_pct(m['trained'])}; dead trained {_pct(m['dead_trained'])}"
        ),
        plots.relu_sparsity,
        trained.runs_relu_sparsity,
    ),
    Claim(
        "gelu-vs-relu",
        "GELU trains better than ReLU, at a small extra cost.",
        "Held-out accuracy and loss on listops after the same budget, several seeds; the cost is the "
        "median forward+backward time of a GELU FFN over a ReLU one, interleaved in one process.",
        {**_TRAIN_QUICK, "seeds": 2},
        {**_TRAIN_FULL, "seeds": 3},
        trained.measure_gelu_vs_relu,
        verdicts.gelu_vs_relu,
        lambda m: (
            f"ReLU {_pct(m['relu']['accuracy'])}, GELU {_pct(m['gelu']['accuracy'])}, "
            f"GELU time {m['time_ratio']:.2f}x"
        ),
        plots.gelu_vs_relu,
        trained.runs_gelu_vs_relu,
    ),
    Claim(
        "no-residual-depth",
        "Without residual connections a 10-layer network's gradients vanish and a 20-layer one fails to "
        "train.",
        "Train listops with residual none and add at several depths (pre-norm, the stack that trains at "
        "depth, so only the residual differs); "
        "held-out accuracy at a fixed budget.",
        {**_TRAIN_QUICK, "norm_position": "pre", "depths": [2, 6, 12], "trains_at": 0.3, "fails_below": 0.15},
        {**_TRAIN_FULL, "norm_position": "pre", "depths": [2, 10, 20], "trains_at": 0.9, "fails_below": 0.5},
        trained.measure_no_residual_depth,
        verdicts.no_residual_depth,
        lambda m: "depth {}: add {}, none {}".format(
            " ".join(map(str, m["depths"])), _pct(m["add"]), _pct(m["none"])
        ),
        plots.no_residual_depth,
        trained.runs_no_residual_depth,
    ),
    Claim(
        "pre-vs-post-warmup",
        "Post-norm needs learning-rate warmup at a high learning rate; pre-norm does not.",
        "Train post- and pre-norm stacks at a high peak learning rate with linear warmup and without "
        "(warmup 0); held-out accuracy at the same budget (a diverged run counts as 0).",
        {**_TRAIN_QUICK, "depth": 4, "lr": 1e-2, "warmup": 50},
        {**_TRAIN_FULL, "depth": 12, "lr": 1e-2, "warmup": 100},
        trained.measure_pre_vs_post_warmup,
        verdicts.pre_vs_post_warmup,
        lambda m: (
            f"post {_pct([m['post']['warmup'], m['post']['no_warmup']])}, "
            f"pre {_pct([m['pre']['warmup'], m['pre']['no_warmup']])} (warmup, none)"
        ),
        plots.pre_vs_post_warmup,
        trained.runs_pre_vs_post_warmup,
    ),
    Claim(
        "norm-lr-robustness",
        "LayerNorm makes training robust to the learning rate.",
        "Train with LayerNorm (standard) and without (norm none) over a learning-rate sweep; held-out "
        "accuracy at the same budget.",
        {**_TRAIN_QUICK, "lrs": [1e-3, 1e-2, 1e-1], "trains_at": 0.3},
        {**_TRAIN_FULL, "lrs": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1], "trains_at": 0.9},
        trained.measure_norm_lr_robustness,
        verdicts.norm_lr_robustness,
        lambda m: "lr {}: LN {}, none {}".format(
            " ".join(f"{x:g}" for x in m["lrs"]), _pct(m["standard"]), _pct(m["none"])
        ),
        plots.norm_lr_robustness,
        trained.runs_norm_lr_robustness,
    ),
    Claim(
        "pre-norm-depth",
        "Pre-norm trains deep stacks where post-norm struggles.",
        "Train pre- and post-norm stacks of increasing depth on listops with the same budget (warmup "
        "included); held-out accuracy.",
        {**_TRAIN_QUICK, "depths": [4, 12, 24], "trains_at": 0.3},
        {**_TRAIN_FULL, "depths": [6, 24, 48, 100], "steps": 400, "trains_at": 0.5},
        trained.measure_pre_norm_depth,
        verdicts.pre_norm_depth,
        lambda m: "depth {}: pre {}, post {}".format(
            " ".join(map(str, m["depths"])), _pct(m["pre"]), _pct(m["post"])
        ),
        plots.pre_norm_depth,
        trained.runs_pre_norm_depth,
    ),
    Claim(
        "layernorm-vs-batchnorm",
        "LayerNorm normalizes each position on its own, so its output does not depend on the batch or on "
        "train/eval mode, and it works at any batch size and with padding; BatchNorm does neither.",
        "One sequence's logits with other batch-mates and in train vs eval mode (at init); then held-out "
        "accuracy of LayerNorm and BatchNorm (norm='batch': statistics over batch and positions, running "
        "statistics in eval) at batch sizes 1, 8 and 64 on listops, and on padded variable-length "
        "batches (listops-padded, 1-4 arguments, pads seen as tokens since the trainer passes no mask).",
        {**_TRAIN_QUICK, "batch": 16, "batch_sizes": [1, 8, 64]},
        {**_TRAIN_FULL, "batch": 16, "batch_sizes": [1, 8, 64]},
        trained.measure_layernorm_vs_batchnorm,
        verdicts.layernorm_vs_batchnorm,
        lambda m: "acc {}: LN {}, BN {}".format(
            " ".join(m["settings"]),
            _pct(list(m["accuracy"]["standard"].values())),
            _pct(list(m["accuracy"]["batch"].values())),
        ),
        plots.layernorm_vs_batchnorm,
        trained.runs_layernorm_vs_batchnorm,
    ),
]
REGISTRY: dict[str, Claim] = {c.name: c for c in CLAIMS}


def select(names: list[str] | None) -> list[Claim]:
    """The named claims (all for None), in registry order; ValueError naming unknown ones."""
    if not names:
        return list(CLAIMS)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown claim {', '.join(unknown)}; claims are: {', '.join(REGISTRY)}")
    return [c for c in CLAIMS if c.name in names]


def _cost(spec: RunSpec) -> float:
    """Rough relative cost of a run (steps x layers), to start the longest first."""
    return spec.train.get("steps", 600) * spec.model.get("n_layers", 2)


def clean(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become None, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def run_claims(
    names: list[str] | None = None,
    quick: bool = False,
    jobs: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the selected claims; the report: each claim's text, method, numbers, verdict and reason."""
    chosen = select(names)
    jobs = default_jobs() if jobs is None else jobs
    start = time.perf_counter()
    specs = {c.name: c.runs(c.params(quick)) if c.runs else [] for c in chosen}
    bar = _progress() if progress else None
    bars = {c.name: bar.add_task(c.name, total=len(specs[c.name]) + 1) if bar else None for c in chosen}
    advance = lambda name: bar.advance(bars[name]) if bar else None  # noqa: E731
    all_specs = sorted((s for ss in specs.values() for s in ss), key=_cost, reverse=True)
    results: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}

    def train_all() -> None:
        results.update(run_many(all_specs, jobs, lambda spec, _: advance(spec.key.split("/")[0])))

    worker = threading.Thread(target=train_all, daemon=True)
    out = []
    threads = torch.get_num_threads()
    if jobs > 1 and all_specs:
        torch.set_num_threads(1)  # the workers have the other cores
    with bar if bar else _nothing():
        worker.start()  # training runs go to worker processes while this thread measures the rest
        measured: dict[str, dict[str, Any]] = {}
        for claim in (c for c in chosen if not c.runs):
            t0 = time.perf_counter()
            measured[claim.name] = claim.measure(claim.params(quick))
            seconds[claim.name] = time.perf_counter() - t0
            advance(claim.name)
        worker.join()
        if len(results) != len(all_specs):
            raise RuntimeError("training runs did not finish")
        for claim in (c for c in chosen if c.runs):
            t0 = time.perf_counter()
            measured[claim.name] = claim.measure(claim.params(quick), results)
            seconds[claim.name] = (
                time.perf_counter() - t0 + sum(results[s.key]["seconds"] for s in specs[claim.name])
            )
            advance(claim.name)
    torch.set_num_threads(threads)
    for claim in chosen:
        m = clean(measured[claim.name])
        v = claim.verdict(m)
        out.append(
            {
                "name": claim.name,
                "claim": claim.claim,
                "method": claim.method,
                "params": claim.params(quick),
                "runs": len(specs[claim.name]),
                "seconds": round(seconds[claim.name], 2),
                "headline": claim.headline(m),
                **v.to_dict(),
                "measurements": m,
            }
        )
    return {
        "mode": "quick" if quick else "full",
        "jobs": jobs,
        "seconds": round(time.perf_counter() - start, 1),
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": default_jobs(),
            "platform": platform.platform(),
        },
        "claims": out,
    }


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def schema() -> dict[str, Any]:
    """The JSON schema of a claims report (``claims_schema.json``)."""
    return json.loads(resources.files(__package__).joinpath("claims_schema.json").read_text())


VERDICT_STYLE = {"holds": "green", "partly": "yellow", "fails": "red"}


def claims_table(report: dict[str, Any]) -> Any:
    """A rich Table: claim, verdict, key numbers, the checks that did not hold."""
    from rich.table import Table

    table = Table(
        title=f"blocklab claims ({report['mode']}, {report['seconds']:.0f} s, {report['jobs']} jobs)",
        show_lines=True,
    )
    for col, kw in (("claim", {"style": "bold"}), ("verdict", {}), ("measured", {}), ("not true", {})):
        table.add_column(col, **kw)
    for c in report["claims"]:
        failed = "; ".join(ch["check"] for ch in c["checks"] if not ch["ok"]) or "-"
        style = VERDICT_STYLE[c["verdict"]]
        table.add_row(c["name"], f"[{style}]{c['verdict']}[/{style}]", c["headline"], failed)
    return table


def claims_html(report: dict[str, Any]) -> str:
    """A self-contained page: summary table, then per claim its text, method, checks, plot, numbers."""
    from ..report import png

    esc = html.escape
    rows = "".join(
        f"<tr><td><a href='#{c['name']}'>{c['name']}</a></td><td class={c['verdict']}>{c['verdict']}</td>"
        f"<td>{esc(c['headline'])}</td></tr>"
        for c in report["claims"]
    )
    parts = [
        f"<h1>blocklab claims</h1><p class=note>{report['mode']} run, {report['seconds']:.0f} s, "
        f"{report['jobs']} worker processes; torch {report['machine']['torch']} on "
        f"{esc(report['machine']['platform'])}</p>",
        f"<table><tr><th>claim</th><th>verdict</th><th>measured</th></tr>{rows}</table>",
    ]
    for c in report["claims"]:
        fig = Figure(figsize=(12, 4))
        REGISTRY[c["name"]].plot(c["measurements"], fig)
        checks = "".join(
            f"<li class={'ok' if ch['ok'] else 'no'}>{'&#10003;' if ch['ok'] else '&#10007;'} "
            f"{esc(ch['check'])}</li>"
            for ch in c["checks"]
        )
        parts += [
            f"<h2 id='{c['name']}'>{c['name']} <span class={c['verdict']}>{c['verdict']}</span></h2>",
            f"<p><b>Claim.</b> {esc(c['claim'])}</p><p><b>Method.</b> {esc(c['method'])}</p>",
            f"<ul>{checks}</ul>",
            png(fig),
            f"<details><summary>numbers ({c['runs']} training runs, {c['seconds']:.1f} s; parameters "
            f"{esc(json.dumps(c['params']))})</summary><pre>{esc(json.dumps(c['measurements'], indent=1))}"
            "</pre></details>",
        ]
    css = (
        "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
        "table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}"
        ".holds{color:#14852b;font-weight:bold}.partly{color:#b07800;font-weight:bold}"
        ".fails{color:#c0262d;font-weight:bold}li.ok{color:#14852b}li.no{color:#c0262d}"
        "img{max-width:100%}.note{color:#666}pre{font-size:11px;max-height:30em;overflow:auto}"
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>blocklab claims</title><style>{css}"
        f"</style></head><body>{''.join(parts)}</body></html>\n"
    )
