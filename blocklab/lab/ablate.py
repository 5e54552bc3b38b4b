"""``blocklab ablate``: a grid of configurations, several seeds each, one run folder per cell and seed.

    blocklab ablate --task listops --vary norm_position=post,pre --vary n_layers=2,6 --seeds 3 --steps 400

The grid is the product of the ``--vary`` lists (any ModelConfig field, or a TrainConfig field
such as lr, warmup, steps). Folder layout::

    OUT/summary.json                     per cell: accuracy / loss mean and std, steps to target, diverged
    OUT/report.html                      overlaid curves and gradient-flow profiles side by side
    OUT/<cell>/seed-<k>/                 a normal run folder (config.json, metrics.jsonl, checkpoints;
                                         report.html with --run-reports)
    OUT/<cell>/seed-<k>/result.json      written when the run finished: its presence marks it done

Resumable: rerunning the same command skips finished runs and resumes interrupted ones from their
newest checkpoint.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..files.atomic import atomic_write_bytes, refuse_links_below
from ..files.folders import REPORT, RESULT, SUMMARY, claim_folder, new_marker, write_marker
from ..files.jsonfiles import read_json, write_json
from ..nn.config import FIELDS
from ..nn.presets import preset
from ..tasks import task_from_dict
from ..training.loop import TRAIN_FIELDS, TrainConfig
from .executors import Executor
from .grid import MAX_RUNS, RunSpec, result_problem


def grid_cells(vary: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the varied values, first field slowest."""
    return [dict(zip(vary, combo, strict=True)) for combo in itertools.product(*vary.values())] or [{}]


def cell_name(cell: dict[str, Any]) -> str:
    """A folder name for a cell: ``n_layers-2__norm_position-pre`` (``base`` for the empty grid)."""
    return "__".join(f"{k}-{v}" for k, v in cell.items()).replace("/", "_") or "base"


def plan(
    task: dict[str, Any],
    preset_name: str,
    model: dict[str, Any],
    train: dict[str, Any],
    vary: dict[str, list[Any]],
    seeds: int,
    out: Path,
    log_diagnostics: int = 0,
    run_reports: bool = False,
) -> list[tuple[dict[str, Any], list[RunSpec]]]:
    """The cells and their runs; every configuration is validated before anything trains."""
    if seeds < 1:
        raise ValueError(f"--seeds={seeds} must be >= 1")
    runs = math.prod(len(values) for values in vary.values()) * seeds
    if runs > MAX_RUNS:
        cells = " x ".join(str(len(v)) for v in vary.values()) or "1"
        raise ValueError(f"the grid is {runs:,} runs ({cells} cells x {seeds:,} seeds); at most {MAX_RUNS:,} "
                         "are planned at once: ask for fewer")
    overrides = task_from_dict(task).config_overrides()
    cells = []
    for cell in grid_cells(vary):
        model_part = {**model, **{k: v for k, v in cell.items() if k in FIELDS}}
        train_part = {**train, **{k: v for k, v in cell.items() if k in TRAIN_FIELDS}}
        preset(preset_name, **{**overrides, **model_part})  # raises on an invalid cell
        TrainConfig(**train_part)
        name = cell_name(cell)
        runs = [
            RunSpec(
                key=f"{name}/seed-{s}",
                model=model_part,
                train={**train_part, "seed": s},
                task=task,
                preset=preset_name,
                out_dir=str(out / name / f"seed-{s}"),
                log_diagnostics=log_diagnostics,
                report=run_reports,
            )
            for s in range(seeds)
        ]
        cells.append((cell, runs))
    return cells


def _mean_std(xs: list[float]) -> dict[str, float | None]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return {"mean": None, "std": None}
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def summarize(cell: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell over its seeds: accuracy and loss mean/std, steps to target, diverged runs."""
    reached = [r["steps_to_target"] for r in results if r.get("steps_to_target") is not None]
    return {
        "cell": cell,
        "name": cell_name(cell),
        "seeds": len(results),
        "accuracy": _mean_std([r["accuracy"] for r in results]),
        "eval_loss": _mean_std([r["eval_loss"] for r in results]),
        "loss": _mean_std([r["loss"] for r in results]),
        "steps_to_target": _mean_std(reached),
        "reached_target": len(reached),
        "diverged": sum(bool(r["diverged"]) for r in results),
        "seconds": sum(r.get("seconds", 0.0) for r in results),
    }


def ablate(
    task: dict[str, Any],
    vary: dict[str, list[Any]],
    out: str | Path,
    seeds: int = 1,
    preset_name: str = "listops-seed",
    model: dict[str, Any] | None = None,
    train: dict[str, Any] | None = None,
    executor: Executor | None = None,
    target: float = 0.9,
    log_diagnostics: int = 0,
    run_reports: bool = False,
    on_done: Callable[[RunSpec, dict[str, Any], bool], None] | None = None,
) -> dict[str, Any]:
    """Run the grid (finished runs are skipped); write summary.json and report.html; return the summary.

    ``executor``: where the runs execute (default: one at a time, in this process; ``lab.executors``).
    ``on_done(spec, result, skipped)`` is called for every run, finished earlier or now;
    ``run_reports`` also writes each run's own report.html (a second or two per run).
    """
    if not (isinstance(target, (int, float)) and not isinstance(target, bool) and 0 < target <= 1):
        raise ValueError(f"target={target!r}: the steps-to-target accuracy must be a fraction in (0, 1]")
    out = Path(out)
    cells = plan(task, preset_name, model or {}, train or {}, vary, seeds, out, log_diagnostics, run_reports)
    lock, marker = claim_folder(out, "ablation")  # a grid of ours, not a training run, not held by another
    try:
        for _, runs in cells:  # every run folder of the plan: no link between the grid and it
            for spec in runs:
                refuse_links_below(out, Path(spec.out_dir))
        if marker is None:
            write_marker(out, new_marker("ablation"))
        return _run_grid(cells, out, task, preset_name, model, train, vary, seeds,
                         executor or Executor(jobs=1), target, on_done)
    finally:
        lock.release()


def _run_grid(
    cells: list[tuple[dict[str, Any], list[RunSpec]]],
    out: Path,
    task: dict[str, Any],
    preset_name: str,
    model: dict[str, Any] | None,
    train: dict[str, Any] | None,
    vary: dict[str, list[Any]],
    seeds: int,
    executor: Executor,
    target: float,
    on_done: Callable[[RunSpec, dict[str, Any], bool], None] | None,
) -> dict[str, Any]:
    """Run the grid's unfinished runs in ``out`` (claimed and locked by ``ablate``); write its summary."""
    results: dict[str, dict[str, Any]] = {}
    pending = []
    for _, runs in cells:
        for spec in runs:
            done = Path(spec.out_dir) / RESULT
            if done.exists() or done.is_symlink():
                try:
                    results[spec.key] = read_json(done, "a run's result.json", result_problem)
                except ValueError as error:
                    raise ValueError(f"{error}; it is not a result blocklab wrote: remove it to train that "
                                     "run again") from None
                if on_done:
                    on_done(spec, results[spec.key], True)
            else:  # resume an interrupted run from its newest checkpoint
                resume = (Path(spec.out_dir) / "config.json").exists()
                pending.append(RunSpec(**{**spec.to_dict(), "resume": resume}))

    def finished(spec: RunSpec, result: dict[str, Any]) -> None:
        write_json(Path(spec.out_dir) / RESULT, result, root=out)
        if on_done:
            on_done(spec, result, False)

    results.update(executor.run(pending, finished, target))
    summary = {
        "task": task,
        "preset": preset_name,
        "model": model or {},
        "train": train or {},
        "vary": vary,
        "seeds": seeds,
        "target_accuracy": target,
        "cells": [summarize(cell, [results[s.key] for s in runs]) for cell, runs in cells],
    }
    write_json(out / SUMMARY, summary)
    page = ablate_html(summary, {k: results[k] for k in sorted(results)}, out)
    atomic_write_bytes(out / REPORT, page.encode("utf-8"))
    return summary


def fmt_mean_std(ms: dict[str, float | None], pct: bool = False) -> str:
    """``97.5% ± 1.2`` or ``0.0812 ± 0.004``; ``-`` when nothing was measured."""
    if ms["mean"] is None:
        return "-"
    if pct:
        return f"{100 * ms['mean']:.1f}% ± {100 * ms['std']:.1f}"
    return f"{ms['mean']:.4g} ± {ms['std']:.2g}"


def summary_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The summary table's rows: cell, accuracy, held-out loss, steps to target, diverged, time."""
    rows = []
    for c in summary["cells"]:
        steps = fmt_mean_std(c["steps_to_target"]).split(" ±")[0] if c["reached_target"] else "-"
        rows.append(
            [
                c["name"],
                fmt_mean_std(c["accuracy"], pct=True),
                fmt_mean_std(c["eval_loss"]),
                f"{steps} ({c['reached_target']}/{c['seeds']})",
                f"{c['diverged']}/{c['seeds']}" if c["diverged"] else "no",
                f"{c['seconds']:.0f}",
            ]
        )
    return rows


SUMMARY_COLUMNS = ["cell", "accuracy", "held-out loss", "steps to target (reached)", "diverged", "seconds"]


def summary_table(summary: dict[str, Any]) -> Any:
    """A rich Table of the summary."""
    from rich.table import Table

    table = Table(
        title=f"ablation: {', '.join(summary['vary']) or 'base'} ({summary['seeds']} seeds, "
        f"target {summary['target_accuracy']:.0%})"
    )
    for col in SUMMARY_COLUMNS:
        table.add_column(col, justify="left" if col == "cell" else "right", overflow="fold")
    for row in summary_rows(summary):
        table.add_row(*row)
    return table


def _curve_figure(results: dict[str, dict[str, Any]], cells: list[str]) -> Figure:
    fig = Figure(figsize=(12, 3.8))
    loss_ax, acc_ax = fig.subplots(1, 2)
    for i, name in enumerate(cells):
        color = f"C{i % 10}"
        for j, r in enumerate(r for k, r in results.items() if k.split("/")[0] == name):
            label = name if j == 0 else None
            steps = [c["step"] for c in r["curve"] if "loss" in c]
            loss_ax.plot(
                steps, [c["loss"] for c in r["curve"] if "loss" in c], color=color, lw=1, label=label
            )
            pts = [(c["step"], c["eval_accuracy"]) for c in r["curve"] if "eval_accuracy" in c]
            if pts:
                acc_ax.plot(*zip(*pts, strict=True), "o-", ms=2, color=color, lw=1, label=label)
    loss_ax.set(title="training loss", xlabel="step", yscale="log")
    acc_ax.set(title="held-out accuracy", xlabel="step", ylim=(0, 1.02))
    if acc_ax.get_legend_handles_labels()[0]:  # no eval rows, nothing drawn: no empty legend (its warning)
        acc_ax.legend(fontsize="x-small")
    return fig


def _flow_figure(results: dict[str, dict[str, Any]], cells: list[str]) -> Figure | None:
    """Per cell (seed 0): |dL/dx_l| over the layers at the first, middle and last logged step."""
    diags = {name: results[f"{name}/seed-0"].get("diag") or [] for name in cells}
    if not any(diags.values()):
        return None
    fig = Figure(figsize=(min(4 * len(cells), 16), 3.4))
    axes = fig.subplots(1, len(cells), squeeze=False)[0]
    for ax, name in zip(axes, cells, strict=True):
        rows = diags[name]
        for row in [rows[0], rows[len(rows) // 2], rows[-1]] if rows else []:
            ax.plot(row["grad_resid"], "o-", ms=3, label=f"step {row['step']}")
        ax.set(title=name, xlabel="layer (last: top)", yscale="log")
        if rows:
            ax.legend(fontsize="x-small")
    axes[0].set_ylabel("|dL/dx_l| (residual stream)")
    return fig


def ablate_html(summary: dict[str, Any], results: dict[str, dict[str, Any]], out: Path) -> str:
    """The grid's self-contained report page."""
    from ..training.report import png

    esc = html.escape
    cells = [c["name"] for c in summary["cells"]]
    head = "".join(f"<th>{esc(c)}</th>" for c in SUMMARY_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in summary_rows(summary)
    )
    flow = _flow_figure(results, cells)
    parts = [
        f"<h1>blocklab ablation: {esc(', '.join(summary['vary']) or 'base')}</h1>",
        f"<p>task <code>{esc(json.dumps(summary['task']))}</code>, preset {esc(summary['preset'])}, "
        f"{summary['seeds']} seeds, target accuracy {summary['target_accuracy']:.0%}</p>",
        f"<table><tr>{head}</tr>{body}</table>",
        "<h2>Curves</h2>",
        png(_curve_figure(results, cells)),
        "<h2>Gradient flow (residual stream, seed 0)</h2>",
        png(flow) if flow else "<p>not recorded: run with <code>--log-diagnostics K</code></p>",
        "<p>Run folders: "
        + " ".join(
            f"<a href='{esc(k)}/{'report.html' if (out / k / 'report.html').exists() else 'metrics.jsonl'}'>"
            f"{esc(k)}</a>"
            for k in results
        )
        + "</p>",
    ]
    css = (
        "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px}"
        "table{border-collapse:collapse}"
        "td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}img{max-width:100%}"
        "td:first-child,th:first-child{text-align:left}"
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>blocklab ablation</title><style>{css}</style>"
        f"</head><body>{''.join(parts)}</body></html>\n"
    )
