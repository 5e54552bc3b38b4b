"""A claims report shown three ways: a terminal table, a self-contained HTML page, a Markdown table
(for the docs). Every setup's verdict and numbers appear in each; nothing is recomputed here but
the plots, drawn from the report's numbers.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.figure import Figure

from .base import MODEL_DEFAULT_INIT, Numbers

VERDICT_STYLE = {
    "holds": "green",
    "fails": "red",
    "inconclusive": "blue",
    "depends": "magenta",
}
Plotter = Callable[[str], Callable[[Numbers, Figure], None]]  # claim name -> its plot


def _cell(text: str) -> str:
    """Text for a Markdown table cell (a | would end the cell)."""
    return text.replace("|", "\\|")


def _interval(effect: dict[str, Any]) -> str:
    return f"{effect['mean']:+.3g} [{effect['low']:+.3g}, {effect['high']:+.3g}], {effect['n']} seeds"


def effect_text(test: dict[str, Any]) -> str:
    """A test's numbers in a few words: the paired effect and its 95% interval (``needs``: under and without
    the condition), the margin and where it comes from; exact arithmetic: the numbers compared."""
    effect, margin = test["effect"], test["margin"]
    if test["rule"] == "exact":
        got = ", ".join(f"{g:.4g}" for g in effect["got"][:4])
        return f"{got} against {', '.join(f'{e:.4g}' for e in effect['expected'][:4])}"
    if test["rule"] == "needs":
        shown = f"under {_interval(effect['under'])}; without {_interval(effect['without'])}"
    else:
        shown = _interval(effect)
    return f"{shown}; margin {margin['value']:.3g} ({margin['origin']})"


def test_text(test: dict[str, Any]) -> str:
    """One test in a line: outcome, words, rule, numbers, and the neighbours that flip it."""
    flips = [n for n, o in test["neighbours"].items() if o != test["outcome"]]
    sensitivity = f"; fragile: {', '.join(flips)}" if flips else ""
    return f"{test['outcome']}: {test['check']} ({test['rule']}: {effect_text(test)}{sensitivity})"


def _failed(setup: dict[str, Any]) -> str:
    """The failed controls (an inconclusive setup's reason) and then the tests that did not hold."""
    failed = [f"control: {ch['check']}" for ch in setup["controls"] if not ch["ok"]]
    failed += [test_text(t) for t in setup["checks"] if t["outcome"] != "holds"]
    return "; ".join(failed) or "-"


def _changed(setup: dict[str, Any]) -> str:
    """What a setup changes from blocklab's defaults, as JSON ('' when nothing)."""
    fields = {k: setup[k] for k in ("model", "train") if setup[k]}
    if setup["init"] != MODEL_DEFAULT_INIT:
        fields["init"] = setup["init"]
    return json.dumps(fields) if fields else ""


def _title(report: dict[str, Any]) -> str:
    load, training = report["load_average"], report["training"]
    warning = f" [{report['warning']}]" if report.get("warning") else ""
    kept = f", {training['kept']} read back from an earlier invocation" if training["kept"] else ""
    runs = (
        f"{training['runs']} training runs, {training['seconds']:.0f} s of training summed over runs{kept}; "
        if training["runs"]
        else ""
    )
    return (
        f"blocklab claims ({report['mode']}, {runs}{report['seconds']:.0f} s, {report['jobs']} jobs, "
        f"load average {load['mean']:.1f} (max {load['max']:.1f}) on {report['machine']['cpus']} cpus; "
        "registry "
        f"{report['registry']}, code {report['code']}){warning}"
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
        ("not holding", {}),
    ):
        table.add_column(col, **kw)
    for c in report["claims"]:
        for i, s in enumerate(c["setups"]):
            overall = c["verdict"]
            name = (
                f"{c['name']}\n[{VERDICT_STYLE[overall]}]{overall}[/] ({c['sensitivity']['label']})"
                if i == 0
                else ""
            )
            style = VERDICT_STYLE[s["verdict"]]
            table.add_row(
                name, f"{s['name']} ({s['role']})", f"[{style}]{s['verdict']}[/]", s["headline"], _failed(s)
            )
    return table


def claims_markdown(report: dict[str, Any]) -> str:
    """A Markdown table: claim, overall verdict, and per setup its verdict, numbers and failed checks."""
    lines = [
        "| claim | verdict | setup | setup verdict | measured | tests that did not hold |",
        "|---|---|---|---|---|---|",
    ]
    for c in report["claims"]:
        for i, s in enumerate(c["setups"]):
            head = f"`{c['name']}` | **{c['verdict']}** ({c['sensitivity']['label']})" if i == 0 else " | "
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
    lines = ["| claim | verdict | sensitivity | per setup |", "|---|---|---|---|"]
    for c in report["claims"]:
        name = f"[`{c['name']}`]({details}#{c['name']})" if details else f"`{c['name']}`"
        setups = ", ".join(f"{s['name']} {s['verdict']}" for s in c["setups"])
        lines.append(
            f"| {name}: {_cell(c['statement'])} | **{c['verdict']}** | {c['sensitivity']['label']} "
            f"| {_cell(setups)} |"
        )
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
            f'*{c["statement"]}* Source: {src["citation"]}, {src["section"]}: "{src["statement"]}" The test '
            f"reads {src['reads']}.",
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
            lines += [f"    - {_cell(test_text(t))}" for t in s["checks"]]
            lines += [f"    - observation: {text}" for text in s["observations"]]
            if s["training"]:
                lines.append(f"    - training: {settings_text(s['training'])}")
        sens = c["sensitivity"]
        again = ", ".join(f"{n} {v}" for n, v in sens["neighbours"].items()) or "no neighbouring choice"
        lines += ["", f"Verdict: {c['reason']}. Sensitivity: **{sens['label']}** ({again})."]
        if c["notes"]:
            lines += ["", c["notes"]]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def settings_text(training: dict[str, Any]) -> str:
    """A setup's training settings in one line: optimizer, schedule, the common fields, the varied ones."""
    common = ", ".join(f"{k} {v}" for k, v in training["common"].items())
    varied = "; ".join(f"{k} in {v}" for k, v in training["varied"].items())
    return f"{training['optimizer']}; {training['schedule']}; {common}" + (
        f"; varied: {varied}" if varied else ""
    )


def _setup_html(setup: dict[str, Any], plot: Callable[[Numbers, Figure], None]) -> list[str]:
    from ...training.report import png

    esc = html.escape
    fig = Figure(figsize=(12, 3.6))
    plot(setup["measurements"], fig)
    checks = "".join(f"<li class={t['outcome']}>{esc(test_text(t))}</li>" for t in setup["checks"])
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
        f"<p class=note>training: {esc(settings_text(setup['training']))}</p>" if setup["training"] else "",
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
            f"<p><b>Source.</b> {esc(src['citation'])}, {esc(src['section'])}: &ldquo;{esc(src['statement'])}"
            f"&rdquo; The test reads {esc(src['reads'])}.</p>",
            f"<details><summary>the source's setup</summary><table>{used}</table></details>"
            if c["kind"] != "exact"
            else "",
            f"<p><b>Method.</b> {esc(c['method'])}</p><p><b>Verdict.</b> {esc(c['reason'])} "
            f"(<b>{c['sensitivity']['label']}</b>)</p>",
            f"<p><b>Notes.</b> {esc(c['notes'])}</p>" if c["notes"] else "",
        ]
        for s in c["setups"]:
            parts += _setup_html(s, plotter(c["name"]))
    css = (
        "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
        "table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}"
        ".holds{color:#14852b;font-weight:bold}"
        ".fails{color:#c0262d;font-weight:bold}.depends{color:#8a2be2;font-weight:bold}"
        ".inconclusive{color:#1f5fbf;font-weight:bold}li.obs{color:#555;list-style:circle}"
        "li.ok{color:#14852b}li.no{color:#c0262d}li.holds{color:#14852b;font-weight:normal}"
        "li.fails{color:#c0262d;font-weight:normal}li.inconclusive{color:#1f5fbf;font-weight:normal}"
        ".headline{font-family:monospace}"
        "img{max-width:100%}.note{color:#666}pre{font-size:11px;max-height:30em;overflow:auto}"
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>blocklab claims</title><style>{css}"
        f"</style></head><body>{''.join(parts)}</body></html>\n"
    )


def changelog_markdown(changes: Sequence[Any]) -> str:
    """The record's changelog (``changelog.CHANGES``), newest first: what changed, why, and each claim's
    verdict before and after."""
    if not changes:
        return "No change since the first record.\n"
    parts = []
    for change in reversed(changes):
        names = list(dict.fromkeys([*change.before, *change.after]))
        rows = [f"| `{n}` | {change.before.get(n, '-')} | {change.after.get(n, '-')} |" for n in names]
        parts.append("\n".join([
            f"### {change.date} ({change.issue}; registry `{change.registry}`)", "",
            f"**What.** {change.what}", "", f"**Why.** {change.why}", "",
            "| claim | before | after |", "|---|---|---|", *rows, "",
        ]))
    return "\n".join(parts)
