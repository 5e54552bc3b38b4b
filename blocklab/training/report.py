"""A run's ``report.html``: one self-contained page (plots embedded as base64 PNG, no external files).

Sections: summary; loss and accuracy curves; per-layer gradient norms over training; LayerNorm
input statistics over training (from the ``diag`` entries ``--log-diagnostics`` writes); attention
maps on a few held-out examples with the model's answers; the final config.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor

from ..files.atomic import atomic_write_bytes
from ..files.folders import CONFIG, MODEL_FILE, REPORT
from ..files.jsonfiles import read_json
from ..nn.model import Transformer
from ..tasks import ACCURACY_METRICS, IGNORE_INDEX, Task, exact_match, task_from_dict
from .checkpoint import load_checkpoint
from .runfiles import latest_checkpoint, read_metrics
from .state import STATE_FILE, tokens_per_second

N_EXAMPLES = 3  # held-out examples shown with attention maps
MAX_TICKS = 16  # token labels per axis of an attention map, at most (8 pt stays readable)

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { padding: 2px 10px; text-align: left; }
tr:nth-child(even) { background: #f6f6f6; } .num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; } .note { color: #666; } .configs { display: flex; gap: 2em; flex-wrap: wrap; }
code { background: #f2f2f2; padding: 0 3px; }
"""


def png(fig: Figure) -> str:
    """A figure as an ``<img>`` tag with the PNG inline."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have ``key``."""
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def per_layer(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[list[float]]]:
    """(steps, values per layer) from the ``diag`` entries of the rows: ``diag[key]`` is a list by layer."""
    picked = [
        (r["step"], r["diag"][key]) for r in rows if isinstance(r.get("diag"), dict) and key in r["diag"]
    ]
    if not picked:
        return [], []
    steps = [p[0] for p in picked]
    return steps, [list(layer) for layer in zip(*[p[1] for p in picked], strict=True)]


def _log_axis(ax: Any, values: list[float]) -> None:
    if values and min(values) > 0:
        ax.set_yscale("log")


def curves_figure(rows: list[dict[str, Any]], metric: str = "exact_match") -> Figure:
    """Training and held-out loss (log scale), held-out accuracy (the task's ``metric``), learning rate."""
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    loss_ax, acc_ax, lr_ax = fig.subplots(1, 3)
    steps, loss = series(rows, "loss")
    loss_ax.plot(steps, loss, label="train (batch)", lw=1)
    eval_steps, eval_loss = series(rows, "eval_loss")
    loss_ax.plot(eval_steps, eval_loss, "o-", label="held-out", ms=3)
    _log_axis(loss_ax, [v for v in loss + eval_loss if math.isfinite(v)])
    loss_ax.set(title="loss", xlabel="step")
    loss_ax.legend()
    eval_steps, acc = series(rows, "eval_accuracy")
    acc_ax.plot(eval_steps, [100 * a for a in acc], "o-", ms=3, color="tab:green")
    acc_ax.set(title=f"held-out {ACCURACY_METRICS[metric]} (%)", xlabel="step", ylim=(0, 101))
    lr_ax.plot(*series(rows, "lr"), color="tab:purple")
    lr_ax.set(title="learning rate", xlabel="step")
    return fig


def grad_norm_figure(rows: list[dict[str, Any]]) -> Figure | None:
    """Gradient norm of each layer's parameters (before clipping) over training."""
    keys = sorted({k for r in rows for k in r if k.startswith("grad_norm/")}, key=_layer_order)
    if not keys:
        return None
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    ax = fig.subplots()
    values: list[float] = []
    for key in keys:
        steps, vals = series(rows, key)
        ax.plot(steps, vals, label=key.removeprefix("grad_norm/"), lw=1)
        values += vals
    _log_axis(ax, [v for v in values if math.isfinite(v)])
    ax.set(title="gradient norm per layer (before clipping)", xlabel="step")
    ax.legend(ncol=min(len(keys), 6), fontsize="small")
    return fig


def _layer_order(key: str) -> tuple[int, int]:
    name = key.split("/", 1)[1]
    if name.startswith("blocks."):
        return 1, int(name.split(".")[1])
    return (0, 0) if name == "embed" else (2, 0)


def gradient_flow_figure(rows: list[dict[str, Any]]) -> Figure | None:
    """From ``--log-diagnostics``: |dL/dx_l| on the residual stream per layer over training, and the
    identity-path vs branch-path share of the gradient at each residual connection
    (docs/concepts.md#residual-connection)."""
    steps, layers = per_layer(rows, "grad_resid")
    if not steps:
        return None
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    flow_ax, path_ax = fig.subplots(1, 2)
    for i, vals in enumerate(layers):
        flow_ax.plot(steps, vals, "o-", ms=2, lw=1, label=f"x_{i}" if i < len(layers) - 1 else "top")
    _log_axis(flow_ax, [v for layer in layers for v in layer])
    flow_ax.set(title="|dL/dx_l| on the residual stream", xlabel="step")
    flow_ax.legend(fontsize="small", ncol=min(len(layers), 4))
    for kind, style in (("attn", "-"), ("ffn", "--")):
        _, ident = per_layer(rows, f"{kind}_identity")
        _, branch = per_layer(rows, f"{kind}_branch")
        for i, (a, b) in enumerate(zip(ident, branch, strict=True)):
            path_ax.plot(
                steps,
                [y / max(x, 1e-30) for x, y in zip(a, b, strict=True)],
                style,
                lw=1,
                label=f"{kind} {i}",
            )
    _log_axis(path_ax, [1e-6, 1.0])
    path_ax.set(title="branch path / identity path (norms)", xlabel="step")
    path_ax.legend(fontsize="small", ncol=4)
    return fig


def norm_input_figure(rows: list[dict[str, Any]]) -> Figure | None:
    """Mean and variance of each LayerNorm's input (per position, averaged) over training."""
    panels = [
        (k, t)
        for k, t in (
            ("ln1_in_var", "LN1 input variance"),
            ("ln2_in_var", "LN2 input variance"),
            ("ln1_in_mu", "LN1 input mean"),
            ("ln2_in_mu", "LN2 input mean"),
        )
        if per_layer(rows, k)[0]
    ]
    if not panels:
        return None
    fig = Figure(figsize=(12, 3.4 * math.ceil(len(panels) / 2)), layout="constrained")
    axes = fig.subplots(math.ceil(len(panels) / 2), 2, squeeze=False).ravel()
    for ax, (key, title) in zip(axes, panels, strict=False):
        steps, layers = per_layer(rows, key)
        for i, vals in enumerate(layers):
            ax.plot(steps, vals, "o-", ms=2, lw=1, label=f"block {i}")
        if key.endswith("var"):
            _log_axis(ax, [v for layer in layers for v in layer])
        ax.set(title=title, xlabel="step")
        ax.legend(fontsize="small", ncol=min(len(layers), 4))
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    return fig


def attention_figure(
    model: Transformer, task: Task, n: int = N_EXAMPLES
) -> tuple[Figure, list[dict[str, str]]]:
    """Attention weights of every layer (rows) and head (columns) on the first ``n`` held-out
    examples, one panel per example, and the model's answers to them. The heads of a layer share
    one colour scale (0 to the layer's largest weight on that example) and its colorbar, so they
    compare directly; every map is titled by layer and head, its ticks are the tokens."""
    data = task.split("test")
    x, y = data.inputs[:n], data.targets[:n]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits, cache = model.run_with_cache(x, names="*attn.weights")
    model.train(was_training)
    L, H = model.config.n_layers, model.config.n_heads
    fig = Figure(figsize=(min(2.2 + 2.2 * H, 20), len(x) * (0.7 + 2.2 * L)), layout="constrained")
    panels = fig.subfigures(len(x), 1, squeeze=False)[:, 0]
    pad = task.tokenizer.pad_id
    answers = []
    for e, panel in enumerate(panels):
        keep = [t for t, token in enumerate(x[e].tolist()) if token != pad] or [0]
        labels = task.tokenizer.tokens(x[e][keep])
        ticks = list(range(0, len(keep), math.ceil(len(keep) / MAX_TICKS)))
        axes = panel.subplots(L, H, squeeze=False, sharex=True, sharey=True)
        for layer in range(L):
            weights = cache[f"blocks.{layer}.attn.weights"][e][:, keep][:, :, keep]  # (h, T, T)
            top = float(weights.max())
            for head, ax in enumerate(axes[layer]):
                image = ax.imshow(weights[head].numpy(), cmap="viridis", vmin=0, vmax=top)
                ax.set_title(f"layer {layer} · head {head}", fontsize=9)
                ax.set_xticks(ticks, [labels[t] for t in ticks], rotation=90, fontsize=8)
                ax.set_yticks(ticks, [labels[t] for t in ticks], fontsize=8)
                ax.tick_params(length=2, pad=1)
            bar = panel.colorbar(image, ax=axes[layer].tolist(), shrink=0.85, pad=0.01)
            bar.ax.tick_params(labelsize=8)
            bar.set_label(f"layer {layer} weight", fontsize=8)
        scored = (y[e] != IGNORE_INDEX).nonzero().flatten().tolist()
        predicted = logits[e].argmax(-1)
        answers.append(
            {
                "input": task.tokenizer.decode(x[e][keep]),
                "expected": task.decode_answer(y[e][scored].tolist()),
                "predicted": task.decode_answer(predicted[scored].tolist()),
                "correct": _correct(logits[e], y[e], task.metric),
            }
        )
        panel.suptitle(f"example {e + 1}: {answers[-1]['input']}   (rows: query, columns: key)", fontsize=10)
    return fig, answers


def _correct(logits: Tensor, targets: Tensor, metric: str) -> str:
    """One example judged as the task judges: right or not (exact match), or how many of its scored
    tokens are right (a language model's windows are never all right early on, and that says little)."""
    if metric == "token_accuracy":
        scored = targets != IGNORE_INDEX
        right = int(((logits.argmax(-1) == targets) & scored).sum())
        return f"{right} of {int(scored.sum())} tokens"
    return "yes" if bool(exact_match(logits[None], targets[None])[0]) else "no"


def _table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td class=num>{html.escape(_fmt(v))}</td></tr>" for k, v in rows
    )
    return f"<table>{cells}</table>"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "null" if v is None else str(v)


def _summary(folder: Path, config: dict[str, Any], rows: list[dict[str, Any]],
             task: Task) -> list[tuple[str, Any]]:
    """The report's first table: task, steps, the last held-out numbers, loss, time, rate, processes."""
    evals = [r for r in rows if "eval_accuracy" in r]
    last = rows[-1] if rows else {}
    final = evals[-1] if evals else {}
    return [
        ("task", task.name),
        ("steps", last.get("step", 0)),
        (f"held-out {ACCURACY_METRICS[task.metric]}",
         f"{100 * final['eval_accuracy']:.2f}%" if final else "not evaluated"),
        ("held-out loss", final.get("eval_loss")),
        *([("held-out perplexity", final.get("eval_perplexity"))]
          if task.metric == "token_accuracy" and "eval_perplexity" in final else []),
        *([("held-out bits per character", final.get("eval_bits_per_char"))]
          if "eval_bits_per_char" in final else []),
        ("last training loss", last.get("loss")),
        ("wall time (s)", round(last.get("time", 0.0), 1)),
        ("tokens/s (training)", _training_rate(folder)),
        ("processes", config.get("world_size", 1)),
    ]


def _figures(rows: list[dict[str, Any]], model: Transformer, task: Task) -> list[str]:
    """The report's figures, each under its heading (a note where nothing was recorded)."""
    parts = ["<h2>Loss and accuracy</h2>", png(curves_figure(rows, task.metric))]
    grad = grad_norm_figure(rows)
    parts += ["<h2>Gradient norm per layer</h2>", png(grad) if grad else "<p class=note>not recorded</p>"]
    flow = gradient_flow_figure(rows)
    if flow:
        parts += ["<h2>Gradient flow: residual stream, identity vs branch path</h2>", png(flow)]
    norms = norm_input_figure(rows)
    parts.append("<h2>LayerNorm input statistics</h2>")
    parts.append(
        png(norms)
        if norms
        else "<p class=note>not recorded: train with <code>--log-diagnostics K</code> to measure them</p>"
    )
    fig, answers = attention_figure(model, task)
    parts += [
        "<h2>Attention on held-out examples</h2>",
        png(fig),
        "<table><tr><th>input</th><th>expected</th><th>predicted</th><th>correct</th></tr>"
        + "".join("<tr>" + "".join(f"<td>{html.escape(a[k])}</td>" for k in a) + "</tr>" for a in answers)
        + "</table>",
    ]
    return parts


def _configs(config: dict[str, Any]) -> list[str]:
    """The final config's three tables, side by side."""
    parts = ["<h2>Final config</h2><div class=configs>"]
    for part in ("model", "train", "task"):
        parts.append(f"<div><h3>{part}</h3>{_table(list(config.get(part, {}).items()))}</div>")
    return [*parts, "</div>"]


def write_report(folder: str | Path, model: Transformer | None = None, task: Task | None = None) -> Path:
    """Write ``folder/report.html`` from config.json, metrics.jsonl and the model (default: newest one)."""
    folder = Path(folder)
    config = read_json(folder / CONFIG)
    rows = read_metrics(folder)
    task = task if task is not None else task_from_dict(config["task"])
    if model is None:
        newest = latest_checkpoint(folder)
        if newest is None:
            raise ValueError(f"{folder} holds no checkpoint yet, so there is no model to report on")
        model = load_checkpoint(newest / MODEL_FILE).model
    title = f"<h1>blocklab run: {html.escape(folder.name)}</h1>"
    summary = _table(_summary(folder, config, rows, task))
    parts = [title, summary, *_figures(rows, model, task), *_configs(config)]
    page = (
        f"<!doctype html><html><head><meta charset=utf-8><title>blocklab report: {html.escape(folder.name)}"
        f"</title><style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )
    out = folder / REPORT
    atomic_write_bytes(out, page.encode("utf-8"))
    return out


def _training_rate(folder: Path) -> str:
    """The run's tokens/s as ``blocklab train`` prints it: the newest checkpoint's totals (state.json).
    (The metrics lines' ``tokens_per_s`` is each logging window's own rate, for the curves.)"""
    newest = latest_checkpoint(folder)
    try:
        state = read_json(newest / STATE_FILE) if newest is not None else {}
    except (OSError, ValueError):
        return "-"
    tokens, seconds = state.get("tokens"), state.get("train_seconds")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (tokens, seconds)):
        return "-"
    return f"{tokens_per_second(tokens, seconds):,.0f}"
