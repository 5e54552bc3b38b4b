"""A claims report shown three ways: a terminal table, a self-contained HTML page, a Markdown table
(for the docs). Every setup's verdict and numbers appear in each; nothing is recomputed here but
the plots, drawn from the report's numbers.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

from matplotlib.figure import Figure

from .base import MODEL_DEFAULT_INIT, Numbers

VERDICT_STYLE = {
    "holds": "green",
    "partly": "yellow",
    "fails": "red",
    "inconclusive": "blue",
    "depends": "magenta",
}
Plotter = Callable[[str], Callable[[Numbers, Figure], None]]  # claim name -> its plot


def _cell(text: str) -> str:
    """Text for a Markdown table cell (a | would end the cell)."""
    return text.replace("|", "\\|")


def _failed(setup: dict[str, Any]) -> str:
    """The failed controls (an inconclusive setup's reason) and then the checks that did not hold."""
    failed = [f"control: {ch['check']}" for ch in setup["controls"] if not ch["ok"]]
    failed += [ch["check"] for ch in setup["checks"] if not ch["ok"]]
    return "; ".join(failed) or "-"


def _changed(setup: dict[str, Any]) -> str:
    """What a setup changes from blocklab's defaults, as JSON ('' when nothing)."""
    fields = {k: setup[k] for k in ("model", "train") if setup[k]}
    if setup["init"] != MODEL_DEFAULT_INIT:
        fields["init"] = setup["init"]
    return json.dumps(fields) if fields else ""


def _title(report: dict[str, Any]) -> str:
    load, training = report["load_average"], report["training"]
    kept = f", {training['kept']} read back from an earlier invocation" if training["kept"] else ""
    runs = (
        f"{training['runs']} training runs, {training['seconds']:.0f} s of training summed over runs{kept}; "
        if training["runs"]
        else ""
    )
    return (
        f"blocklab claims ({report['mode']}, {runs}{report['seconds']:.0f} s, {report['jobs']} jobs, "
        f"load average {load['mean']:.1f} (max {load['max']:.1f}) on {report['machine']['cpus']} cpus)"
    )


def claims_table(report: dict[str, Any]) -> Any:
    """A rich Table: per claim its overall verdict, then one row per setup (verdict, numbers, what failed)."""
    from rich.table import Table

    table = Table(title=_title(report), show_lines=True)
    for col, kw in (
        ("claim", {"style": "bold"}),
        ("setup", {}),
        ("verdict", {}),
        ("measured", {}),
        ("not true", {}),
    ):
        table.add_column(col, **kw)
    for c in report["claims"]:
        for i, s in enumerate(c["setups"]):
            overall = c["verdict"]
            name = f"{c['name']}\n[{VERDICT_STYLE[overall]}]{overall}[/]" if i == 0 else ""
            style = VERDICT_STYLE[s["verdict"]]
            table.add_row(
                name, f"{s['name']} ({s['role']})", f"[{style}]{s['verdict']}[/]", s["headline"], _failed(s)
            )
    return table


def claims_markdown(report: dict[str, Any]) -> str:
    """A Markdown table: claim, overall verdict, and per setup its verdict, numbers and failed checks."""
    lines = [
        "| claim | verdict | setup | setup verdict | measured | checks that did not hold |",
        "|---|---|---|---|---|---|",
    ]
    for c in report["claims"]:
        for i, s in enumerate(c["setups"]):
            head = f"`{c['name']}` | **{c['verdict']}**" if i == 0 else " | "
            lines.append(
                f"| {head} | {s['name']} ({s['role']}) | {s['verdict']} | {_cell(s['headline'])} "
                f"| {_cell(_failed(s))} |"
            )
    machine = report["machine"]
    lines += ["", f"*{_title(report)}; torch {machine['torch']}, Python {machine['python']}.*"]
    return "\n".join(lines) + "\n"


def claims_summary_markdown(report: dict[str, Any], details: str = "") -> str:
    """A short Markdown table, one row per claim: the claim, its overall verdict and each setup's verdict
    (the README's). ``details``: a link target for the claim names, e.g. ``docs/lab.md``."""
    lines = ["| claim | verdict | per setup |", "|---|---|---|"]
    for c in report["claims"]:
        name = f"[`{c['name']}`]({details}#{c['name']})" if details else f"`{c['name']}`"
        setups = ", ".join(f"{s['name']} {s['verdict']}" for s in c["setups"])
        lines.append(f"| {name}: {_cell(c['statement'])} | **{c['verdict']}** | {_cell(setups)} |")
    lines += ["", f"*{_title(report)}.*"]
    return "\n".join(lines) + "\n"


def claims_details_markdown(report: dict[str, Any]) -> str:
    """Per claim: its statement, source and the source's setup, then each setup's verdict and numbers,
    the overall verdict and the claim's notes (what the numbers say, what changed from earlier records)."""
    parts = []
    for c in report["claims"]:
        src = c["source"]
        lines = [
            f'<a id="{c["name"]}"></a>',  # the summary's link target, whatever the verdict
            "",
            f"### `{c['name']}` — {c['verdict']}",
            "",
            f"*{c['statement']}* Source: {src['citation']}, {src['section']}: {src['statement']}",
        ]
        if c["kind"] != "exact":
            used = "; ".join(f"{k} {v}" for k, v in src["setup"].items())
            lines += ["", f"The source's setup: {used}."]
        lines += ["", f"Method: {c['method']}", ""]
        for s in c["setups"]:
            changed = _changed(s)
            what = f"; `{changed}`" if changed else ""
            lines.append(
                f"- **{s['name']}** ({s['role']}; {s['why']}{what}): **{s['verdict']}** — {s['headline']}"
            )
            lines += [f"    - control not met: {ch['check']}" for ch in s["controls"] if not ch["ok"]]
            lines += [f"    - observation: {text}" for text in s["observations"]]
        lines += ["", f"Verdict: {c['reason']}."]
        if c["notes"]:
            lines += ["", c["notes"]]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def _setup_html(setup: dict[str, Any], plot: Callable[[Numbers, Figure], None]) -> list[str]:
    from ...training.report import png

    esc = html.escape
    fig = Figure(figsize=(12, 3.6))
    plot(setup["measurements"], fig)
    checks = "".join(
        f"<li class={'ok' if ch['ok'] else 'no'}>{'&#10003;' if ch['ok'] else '&#10007;'} "
        f"{esc(ch['check'])}</li>"
        for ch in setup["checks"]
    )
    controls = "".join(
        f"<li class={'ok' if ch['ok'] else 'no'}>control {'&#10003;' if ch['ok'] else '&#10007;'} "
        f"{esc(ch['check'])}</li>"
        for ch in setup["controls"]
    )
    observations = "".join(f"<li class=obs>observation: {esc(text)}</li>" for text in setup["observations"])
    fields = _changed(setup)
    return [
        f"<h3>setup <code>{esc(setup['name'])}</code> ({setup['role']}) "
        f"<span class={setup['verdict']}>{setup['verdict']}</span></h3>",
        f"<p>{esc(setup['why'])}{f' &mdash; <code>{esc(fields)}</code>' if fields else ''}</p>",
        f"<p class=headline>{esc(setup['headline'])}</p><ul>{controls}{checks}{observations}</ul>",
        png(fig),
        f"<details><summary>numbers ({setup['runs']} training runs, {setup['seconds']:.1f} s)</summary>"
        f"<pre>{esc(json.dumps(setup['measurements'], indent=1))}</pre></details>",
    ]


def claims_html(report: dict[str, Any], plotter: Plotter) -> str:
    """A self-contained page: the summary table, then per claim its statement, source, method, notes
    and, per setup, its checks, plot and numbers. ``plotter(name)`` is the claim's plot function."""
    esc = html.escape
    rows = "".join(
        f"<tr><td>{'<a href=#' + c['name'] + '>' + c['name'] + '</a>' if i == 0 else ''}</td>"
        f"<td class={c['verdict']}>{c['verdict'] if i == 0 else ''}</td><td>{esc(s['name'])}</td>"
        f"<td class={s['verdict']}>{s['verdict']}</td><td>{esc(s['headline'])}</td></tr>"
        for c in report["claims"]
        for i, s in enumerate(c["setups"])
    )
    parts = [
        f"<h1>blocklab claims</h1><p class=note>{esc(_title(report))}; torch {report['machine']['torch']} on "
        f"{esc(report['machine']['platform'])}</p>",
        "<table><tr><th>claim</th><th>verdict</th><th>setup</th><th>setup verdict</th><th>measured</th></tr>"
        f"{rows}"
        "</table>",
    ]
    for c in report["claims"]:
        src = c["source"]
        used = "".join(f"<tr><td>{k}</td><td>{esc(v)}</td></tr>" for k, v in src["setup"].items())
        parts += [
            f"<h2 id='{c['name']}'>{c['name']} <span class={c['verdict']}>{c['verdict']}</span></h2>",
            f"<p><b>Claim.</b> {esc(c['statement'])}</p>",
            f"<p><b>Source.</b> {esc(src['citation'])}, {esc(src['section'])}: {esc(src['statement'])}</p>",
            f"<details><summary>the source's setup</summary><table>{used}</table></details>"
            if c["kind"] != "exact"
            else "",
            f"<p><b>Method.</b> {esc(c['method'])}</p><p><b>Verdict.</b> {esc(c['reason'])}</p>",
            f"<p><b>Notes.</b> {esc(c['notes'])}</p>" if c["notes"] else "",
        ]
        for s in c["setups"]:
            parts += _setup_html(s, plotter(c["name"]))
    css = (
        "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
        "table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}"
        ".holds{color:#14852b;font-weight:bold}.partly{color:#b07800;font-weight:bold}"
        ".fails{color:#c0262d;font-weight:bold}.depends{color:#8a2be2;font-weight:bold}"
        ".inconclusive{color:#1f5fbf;font-weight:bold}li.obs{color:#555;list-style:circle}"
        "li.ok{color:#14852b}li.no{color:#c0262d}.headline{font-family:monospace}"
        "img{max-width:100%}.note{color:#666}pre{font-size:11px;max-height:30em;overflow:auto}"
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>blocklab claims</title><style>{css}"
        f"</style></head><body>{''.join(parts)}</body></html>\n"
    )
