"""What the claims share: the lab's small listops model, its training runs, fresh models at init,
number formatting and plot pieces. Each claim's module builds on these; nothing here is a claim.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any

import torch
from torch import Tensor

from ...inspect import diagnostics
from ...inspect.diagnostics import Diagnostics
from ...nn.config import SAVED_BEFORE
from ...nn.model import Transformer
from ...nn.presets import preset
from ...tasks import Task, get_task, task_from_dict
from ..grid import RunSpec, steps_to_target
from ..statistics import Margin
from .base import Results, Setup, Test
from .rules import Pair, compare, noise

Axes = Any

# Training sizes. Quick: a smoke run of about a minute on 2 cores that exercises every claim (source setups
# only, 2 seeds, 40 steps at d_model 16): its verdicts are not evidence. Full: d_model 64 and 600 steps,
# what the listops-seed model needs to reach ~99%, 5 seeds (and 5 more for each null arm).
TRAIN_QUICK: dict[str, Any] = {
    "d_model": 16,
    "steps": 40,
    "lr": 1e-2,
    "warmup": 10,
    "batch_size": 32,
    "eval_every": 20,
    "seeds": 2,
}
TRAIN_FULL: dict[str, Any] = {
    "d_model": 64,
    "steps": 600,
    "lr": 3e-3,
    "warmup": 50,
    "batch_size": 64,
    "seeds": 5,
}
TARGET = 0.99  # a run stops at the first evaluation reaching it: "steps to target", capped by the budget
EVAL_EVERY = 25  # steps between evaluations: the resolution of steps to target
TRAIN_KEYS = ("steps", "lr", "warmup", "batch_size", "eval_every")  # the sizes that are TrainConfig fields
CHANCE = 0.1  # listops: 10 answer digits


def small_model(p: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """ModelConfig fields of the lab's small listops model at width ``p["d_model"]``."""
    d = p["d_model"]
    return {"d_model": d, "d_ff": 4 * d, "n_heads": 4, **fields}


def _merge(
    setup: Setup, part: str, base: dict[str, Any], own: dict[str, Any], run: dict[str, Any]
) -> dict[str, Any]:
    """base < the setup's fields < the run's; a field both the setup and the run set is refused."""
    both = sorted(set(own) & set(run))
    if both:
        raise ValueError(
            f"setup {setup.name!r} sets {part} field {both[0]!r}, which the claim itself varies; "
            "a setup may only change what the claim holds fixed"
        )
    return {**base, **own, **run}


def run_spec(
    claim: str,
    setup: Setup,
    label: str,
    p: dict[str, Any],
    model: dict[str, Any] | None = None,
    task: str | dict[str, Any] = "listops",
    seed: int = 0,
    **train: Any,
) -> RunSpec:
    """One run of ``claim`` in ``setup`` with ``seed``: the claim's sizes ``p``, then the setup's fields
    and init, then the run's; its key is ``claim/setup/label/s<seed>``.

    Evaluation every EVAL_EVERY steps; the run stops at the first evaluation reaching TARGET, so
    runs are compared by whether and when they reach it within the same budget, never by a snapshot.
    """
    sizes = {k: p[k] for k in TRAIN_KEYS if k in p}
    base_train = {"eval_every": EVAL_EVERY, **sizes, "checkpoint_every": 0, "target_accuracy": TARGET}
    fields = _merge(setup, "TrainConfig", base_train, setup.train, train)
    fields["log_every"] = fields["eval_every"]
    fields["warmup"] = min(fields["warmup"], fields["steps"])
    fields["seed"] = seed
    return RunSpec(
        key=f"{claim}/{setup.name}/{label}/s{seed}",
        model={**_merge(setup, "ModelConfig", small_model(p), setup.model, model or {}), "init": setup.init},
        train=fields,
        task={"name": task} if isinstance(task, str) else dict(task),  # a name, or a name and its options
    )


NULL_SEED = 1000  # a null arm runs seeds 1000, 1001, ...: the arm's settings again, other seeds


def _labelled(label: str, null: bool) -> tuple[str, int]:
    return (f"{label}/null", NULL_SEED) if null else (label, 0)


def seeded(
    claim: str,
    setup: Setup,
    label: str,
    p: dict[str, Any],
    model: dict[str, Any] | None = None,
    null: bool = False,
    **train: Any,
) -> list[RunSpec]:
    """``run_spec`` once per seed of the claim's sizes (``p["seeds"]``); ``null``: the null arm of
    ``label``, the same runs from seeds NULL_SEED + s, whose spread against the arm is the seed noise."""
    label, first = _labelled(label, null)
    return [run_spec(claim, setup, label, p, model, seed=first + s, **train) for s in range(p["seeds"])]


def per_seed(
    results: Results, claim: str, setup: Setup, label: str, p: dict[str, Any], null: bool = False
) -> list[dict[str, Any]]:
    """The finished runs of ``label`` (its null arm with ``null``) in ``setup``, one per seed, in seed
    order."""
    label, first = _labelled(label, null)
    return [results[f"{claim}/{setup.name}/{label}/s{first + seed}"] for seed in range(p["seeds"])]


# The readings of a run a test is decided on ("final") and its neighbours in the sensitivity: the same run
# read one evaluation before its last, and at half its budget (a run that stopped earlier at the target
# keeps its last evaluation). Steps to target have no earlier reading: a run that reached the target
# stopped there.
READINGS = ("final", "one evaluation earlier", "half the budget")


def _evaluations(run: dict[str, Any], key: str) -> list[tuple[int, float]]:
    return [(int(row["step"]), float(row[key])) for row in run["curve"] if row.get(key) is not None]


def _at(evals: list[tuple[int, float]], step: int, default: float) -> float:
    """The last evaluation at or before ``step`` (``default`` before the first)."""
    return next((v for s, v in reversed(evals) if s <= step), default)


@cache
def guess_loss(task: str) -> float:
    """ln(vocabulary) of a task (its JSON): the loss of a uniform guess."""
    return math.log(task_from_dict(json.loads(task)).tokenizer.vocab_size)


def run_readings(run: dict[str, Any], budget: int) -> dict[str, dict[str, float]]:
    """One run's accuracy, lowest held-out loss, steps to TARGET, training loss and seconds per step under
    each of READINGS, every number finite: a diverged run counts as accuracy 0 and a uniform guess's loss,
    ln(vocabulary) (no better than guessing), a run that did not reach the target within the budget as one
    evaluation past it."""
    half, every = budget // 2, run["spec"]["train"]["eval_every"]
    acc = [] if run["diverged"] else _evaluations(run, "eval_accuracy")
    loss = [] if run["diverged"] else _evaluations(run, "eval_loss")
    fit = [] if run["diverged"] else _evaluations(run, "loss")  # the training loss of each logged step
    reached_at = None if run["diverged"] else steps_to_target(run["curve"], TARGET)
    censored = lambda cap: reached_at if reached_at is not None and reached_at <= cap else cap + every
    earlier = lambda evals, default: evals[-2][1] if len(evals) > 1 else (evals[-1][1] if evals else default)
    worst_loss = guess_loss(json.dumps(run["spec"]["task"], sort_keys=True))  # a diverged run's losses
    return {
        "accuracy": {
            "final": acc[-1][1] if acc else 0.0,
            "one evaluation earlier": earlier(acc, 0.0),
            "half the budget": _at(acc, half, 0.0),
        },
        "loss": {
            "final": min((v for _, v in loss), default=worst_loss),
            "one evaluation earlier": min((v for _, v in loss[:-1]), default=worst_loss),
            "half the budget": min((v for s, v in loss if s <= half), default=worst_loss),
        },
        "steps": {"final": censored(budget), "half the budget": censored(half)},
        "train_loss": {
            "final": fit[-1][1] if fit else worst_loss,
            "one evaluation earlier": _at(fit, fit[-1][0] - every, worst_loss) if fit else worst_loss,
            "half the budget": _at(fit, half, worst_loss),
        },
        "time_per_step": {"final": run["seconds"] / max(1, run.get("steps") or 1)},
    }


def outcome(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-seed numbers of one arm: final held-out accuracy (None: diverged), steps to TARGET (None: not
    reached within the budget), whether it diverged, the median of what reached the target, and the
    finite per-seed readings the tests use (``run_readings``: {metric: {reading: [per seed]}})."""
    steps = [None if r["diverged"] else steps_to_target(r["curve"], TARGET) for r in runs]
    reached = [s for s in steps if s is not None]
    budget = runs[0]["spec"]["train"]["steps"]
    each = [run_readings(r, budget) for r in runs]
    return {
        "accuracy": [None if r["diverged"] else r["accuracy"] for r in runs],
        "steps_to_target": steps,
        "diverged": [bool(r["diverged"]) for r in runs],
        "budget": budget,
        "eval_every": runs[0]["spec"]["train"]["eval_every"],
        "median_steps": statistics.median(reached) if reached else None,
        "readings": {
            metric: {which: [e[metric][which] for e in each] for which in each[0][metric]}
            for metric in each[0]
        },
    }


def pair(a: dict[str, Any], b: dict[str, Any], metric: str) -> tuple[Pair, dict[str, Pair]]:
    """Arms ``a`` and ``b`` (``outcome``) paired by seed on ``metric`` ("accuracy", "loss", "steps"): the
    final reading, and the other readings as the sensitivity's neighbours."""
    ra, rb = a["readings"][metric], b["readings"][metric]
    return (ra["final"], rb["final"]), {w: (ra[w], rb[w]) for w in ra if w != "final"}


def arms_test(
    check: str, word: str, a: dict[str, Any], b: dict[str, Any], metric: str, better: str, margin: Margin
) -> Test:
    """``rules.compare`` of arm ``b`` against arm ``a`` on ``metric``, the other readings as neighbours."""
    main, alt = pair(a, b, metric)
    return compare(check, word, main, better, margin, alt)


def null_margin(arm: dict[str, Any], null: dict[str, Any], metric: str, what: str) -> Margin:
    """The seed noise of ``metric`` between an arm and its null arm (``rules.noise``), never below the
    number's resolution (``resolution``)."""
    values = arm["readings"][metric]["final"]
    return noise(
        values, null["readings"][metric]["final"], what, *resolution(metric, arm["eval_every"], values)
    )


def resolution(metric: str, eval_every: int, values: list[float]) -> tuple[float, str]:
    """The smallest difference a metric resolves, and its words: a margin below it would call identical
    runs different (and a null arm whose seeds all agree would give none at all)."""
    if metric == "steps":
        return float(eval_every), f"one evaluation ({eval_every} steps)"
    if metric == "accuracy":
        return 1e-3, "a tenth of a point of accuracy"
    if metric == "time_per_step":
        return 0.01 * statistics.median(values), "1% of the arm's median time"
    return 1e-3, "a thousandth of a nat"  # the losses


def reading(arm: dict[str, Any], metric: str) -> tuple[list[float], dict[str, list[float]]]:
    """One arm's final per-seed ``metric`` and its other readings (``pair`` for one arm against a bound)."""
    r = arm["readings"][metric]
    return r["final"], {w: v for w, v in r.items() if w != "final"}


def median_accuracy(arm: dict[str, Any]) -> float:
    """The median final accuracy of an arm's seeds (a diverged run as 0)."""
    return sorted(fin(a) for a in arm["accuracy"])[len(arm["accuracy"]) // 2]  # n // 2: the upper of two


def reached(arm: dict[str, Any]) -> list[bool]:
    """Per seed: the run reached TARGET within its budget."""
    return [s is not None for s in arm["steps_to_target"]]


def trains(arm: dict[str, Any], at: float) -> list[bool]:
    """Per seed: the run ended at or above ``at`` (a run that reached TARGET stopped there; diverged: no)."""
    return [fin(a) >= at for a in arm["accuracy"]]


def above_chance(arm: dict[str, Any], margin: float = 0.1) -> list[bool]:
    """Per seed: the run ended clearly above chance (CHANCE + ``margin``)."""
    return trains(arm, CHANCE + margin)


def fin(x: float | None) -> float:
    """An accuracy that may be None / NaN (diverged, not measured) as 0.0."""
    return 0.0 if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


@lru_cache(maxsize=1)
def _listops() -> Task:
    return get_task("listops")


def listops_batch(n: int, split: str = "train") -> tuple[Tensor, Tensor]:
    """The first ``n`` listops examples of a split: inputs (n, 8), targets (n, 8)."""
    data = _listops().split(split)
    return data.inputs[:n], data.targets[:n]


def fresh_model(p: dict[str, Any], setup: Setup, seed: int, **fields: Any) -> Transformer:
    """A seeded listops model of the claim's size in ``setup`` (its fields and init scheme)."""
    torch.manual_seed(seed)
    both = sorted(set(setup.model) & set(fields))
    if both:
        raise ValueError(f"setup {setup.name!r} sets {both[0]!r}, which the claim itself varies")
    return Transformer(preset("listops-seed", **small_model(p, **setup.model, **fields), init=setup.init))


def every_token_batch(n: int) -> tuple[Tensor, Tensor]:
    """The first ``n`` listops training examples scored on every position, as a language model is: each
    position's target is the next token, the last one's the answer (inputs (n, 8), targets (n, 8))."""
    inputs, targets = listops_batch(n)
    answer = targets[:, -1:]  # listops scores only the last position: its target is the answer
    return inputs, torch.cat([inputs[:, 1:], answer], dim=1)


def diagnose(
    p: dict[str, Any], setup: Setup, n: int, seed: int, every_token: bool = False, **fields: Any
) -> Diagnostics:
    """Gradient flow and forward statistics of a fresh model (``fresh_model``) on ``n`` listops examples;
    ``every_token``: a causal model with every position scored (``every_token_batch``)."""
    if every_token:
        return diagnostics.diagnose(fresh_model(p, setup, seed, causal=True, **fields), *every_token_batch(n))
    return diagnostics.diagnose(fresh_model(p, setup, seed, **fields), *listops_batch(n))


def seconds_per_rep(
    fns: dict[str, Callable[[Tensor], Tensor]], x: Tensor, reps: int
) -> dict[str, list[float]]:
    """Forward+backward seconds of each function on ``x``, one per repetition (a fresh leaf each time, so
    the backward reaches the input as in a network), interleaved so the functions of one repetition see
    the same load: repetition r of each is a pair."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            xi = x.detach().requires_grad_()
            start = time.perf_counter()
            fn(xi).sum().backward()
            times[name].append(time.perf_counter() - start)
    return times


def median_seconds(fns: dict[str, Callable[[Tensor], Tensor]], x: Tensor, reps: int) -> dict[str, float]:
    """The median of ``seconds_per_rep``."""
    return {name: statistics.median(ts) for name, ts in seconds_per_rep(fns, x, reps).items()}


# ---- formatting and plots -----------------------------------------------------------------------


def pct(xs: list[float | None]) -> str:
    """Accuracies as ``99% 42% div`` (None: a diverged run)."""
    return " ".join("div" if x is None else f"{100 * x:.0f}%" for x in xs)


def reach_text(arm: dict[str, Any]) -> str:
    """One arm in a few characters: ``3/3 @150`` (seeds reaching the target of all, median steps) or
    ``0/3 (42%)`` (none did: the median final accuracy, ``div`` where most diverged)."""
    k, n = sum(reached(arm)), len(arm["steps_to_target"])
    if arm["median_steps"] is not None:
        return f"{k}/{n} @{arm['median_steps']:g}"
    finals = sorted(fin(a) for a in arm["accuracy"])
    return f"0/{n} ({'div' if 2 * sum(arm['diverged']) > n else f'{100 * finals[n // 2]:.0f}%'})"


def g2(x: float | None) -> str:
    """Two significant digits; None (a number that was not finite, as the report stores it): "n/f"."""
    return "n/f" if x is None else f"{x:.2g}"


def bars(ax: Axes, groups: list[str], series: dict[str, list[float | None]], ylabel: str) -> None:
    """Grouped bars: one group per label in ``groups``, one bar per series."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [0.0 if v is None else v for v in values], width, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")


def seed_lines(ax: Axes, xs: list[float], arms: list[dict[str, Any]], style: str, label: str) -> None:
    """One arm per x: the median accuracy over seeds as a line, each seed's as a faint dot."""
    line = ax.plot(xs, [median_accuracy(arm) for arm in arms], style, label=label)[0]
    for x, arm in zip(xs, arms, strict=True):
        seeds = arm["accuracy"]
        ax.plot([x] * len(seeds), [fin(a) for a in seeds], ".", color=line.get_color(), alpha=0.5)


def steps_bars(ax: Axes, arms: dict[str, dict[str, Any]]) -> None:
    """Steps to the target per seed, one bar per arm (a missing bar: not reached within the budget)."""
    first = next(iter(arms.values()))
    seeds = [f"seed {i}" for i in range(len(first["steps_to_target"]))]
    bars(ax, seeds, {name: arm["steps_to_target"] for name, arm in arms.items()}, "steps to 99% held-out")


def accuracy_axis(ax: Axes) -> None:
    """Accuracy from 0 to 1, chance marked."""
    ax.set_ylim(0, 1.02)
    ax.axhline(CHANCE, color="grey", lw=0.6, ls=":")


def curves(ax: Axes, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Held-out accuracy over training, one line per run."""
    for name, curve in runs.items():
        pts = [(c["step"], c["eval_accuracy"]) for c in curve if "eval_accuracy" in c]
        if pts:
            ax.plot(*zip(*pts, strict=True), "-o", ms=2, label=name)
    ax.set(xlabel="step", ylabel="held-out accuracy")
    accuracy_axis(ax)
    ax.legend(fontsize="x-small")


# ---- confounds several claims share ------------------------------------------------------------

# The input embedding blocklab had before issue 13 (config.SAVED_BEFORE's embedding fields)
EARLIER_EMBEDDING: dict[str, Any] = {k: SAVED_BEFORE[k] for k in ("embed_scale", "embed_std")}


def torch_init(setup: Setup) -> Setup:
    """``setup`` with blocklab's default init instead of the source's (the confound of every claim whose
    source names an init)."""
    return setup.but("torch-init", "blocklab's default init (PyTorch's nn.Linear variance)", init="torch")


def learned_positions(setup: Setup) -> Setup:
    """``setup`` with learned positions (GPT-2's) instead of the sinusoidal code."""
    return setup.but(
        "learned-positions",
        "learned positions (GPT-2's) instead of the sinusoidal code: changes the kind and the size of the "
        "position signal next to the tokens'",
        model={"pos_encoding": "learned"},
    )


def earlier_embedding(setup: Setup) -> Setup:
    """``setup`` with the input embedding blocklab had before issue 13: GPT-2's N(0, 0.02^2) token table,
    unscaled (``config.SAVED_BEFORE``)."""
    return setup.but(
        "tokens-0.02",
        "the earlier default embedding: GPT-2's N(0, 0.02^2) token table with no sqrt(d_model) factor, so "
        "the tokens are a few percent of the block's input next to the sinusoidal code of amplitude 1",
        model=EARLIER_EMBEDDING,
    )
