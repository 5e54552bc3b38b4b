"""The trace as one self-contained HTML page: no network, no external file.

Stages are sections in forward order, each with its words, a heatmap (positions x features
for the residual stream and every other vector stage; one query x key map per head for
attention, titled by layer and head) and its per-position statistics. The heatmaps are drawn by
``heatmap.js``, the script the explore page draws its heatmaps with too (inlined here, served there):
colour scales, colorbars, and on hover each cell's value and how it was computed, with its operands
(the stage records' ``operands`` and ``norm``, embedded with the page as the trace JSON has them, so
both pages say the same of the same number). A small page script lays the maps out. Attention maps
share a colour scale so heads compare: per layer by default, per head or per model by the page's
control (or ``#scale=head`` in the link). When it has drawn them all the script sets
``data-rendered`` on the root element, and each canvas's ``data-range`` (the scale it used): the
browser tests read them.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from ...nn.layouts import LAYOUTS
from .collect import json_numbers, norm_operands, operands_to_dict
from .record import MAX_COLUMNS, PER_HEAD_KINDS, STAT_NAMES, Stage, Trace
from .text import (
    PARTS_HEADERS,
    PARTS_TITLE,
    column_labels,
    fmt,
    lens_table,
    norm_cells,
    norm_headers,
    parts_cells,
    shown_columns,
    shows_predictions,
    top_k_table,
)

STREAM_KINDS = ("embed", "resid_pre", "resid_mid", "resid_post")
# the heatmaps' script, shared with the explore page (which serves this same text as /static/heatmap.js)
HEATMAP_JS = resources.files(__package__).joinpath("heatmap.js").read_text(encoding="utf-8")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


# the attention maps' colour scale, chosen on the page (one control for every map); the default first
SCALE_MODES = {
    "layer": "one per layer: the heads of a layer share a scale and compare directly",
    "head": "one per head: each head's own range (shapes, not strengths)",
    "model": "one for the whole model: every layer's heads share a scale",
}


def value_range(values: Tensor, sequential: bool, from_zero: bool = True) -> tuple[float, float]:
    """A colour scale's ends for ``values``: sequential from 0 (or the smallest value) to the
    largest; diverging symmetric about 0. Non-finite entries (masked scores) are left out."""
    finite = values[values.isfinite()]
    lo = float(finite.min()) if finite.numel() else 0.0
    hi = float(finite.max()) if finite.numel() else 0.0
    if sequential:
        vmin = min(lo, 0.0) if from_zero else lo
        return vmin, (hi if hi > vmin else vmin + 1)
    vmax = max(abs(lo), abs(hi)) or 1.0
    return -vmax, vmax


class Page:
    """Collects the heatmaps (data for the script) and the stage records they show while the sections
    are written."""

    def __init__(self, trace: Trace, decimals: int) -> None:
        self.trace, self.decimals = trace, decimals
        self.maps: list[dict] = []
        self.bars: list[dict] = []  # a layer's shared colorbar (attention maps)
        self.stages: dict[str, dict] = {}  # the records the maps draw and explain, by name
        # each attention kind's range over every layer and head: the "model" scale
        self.model_ranges = {
            kind: value_range(torch.cat([s.heads.flatten() for s in trace.stages if s.kind == kind]),
                              kind == "attn.weights")
            for kind in ("attn.scores", "attn.weights") if any(s.kind == kind for s in trace.stages)
        }

    def record(self, stage: Stage, columns: list[int]) -> None:
        """The stage as the trace JSON has it (values, heads, norm, operands), its values at the shown
        ``columns`` only: a vocabulary's 50k would not fit a page, and no formula reads them."""
        rows = stage.rows[:, columns]
        record = {"name": stage.name, "kind": stage.kind, "block": stage.block, "shape": list(stage.shape),
                  "positions": stage.positions, "values": json_numbers(rows)}
        if stage.heads is not None:
            record["heads"] = json_numbers(stage.heads)
        if stage.norm is not None:
            record["norm"] = {**{k: json_numbers(getattr(stage.norm, k)) for k in ("mu", "denom", "z_hat")},
                              **norm_operands(stage.norm)}
        if stage.operands is not None:
            record["operands"] = operands_to_dict(stage.operands)
        self.stages[stage.name] = record

    def heatmap(self, rows: Tensor, row_labels: list[str], col_labels: list[str] | None, sequential: bool,
                caption: str, group: int = 0, from_zero: bool = True,
                scales: dict[str, tuple[float, float]] | None = None, title: str = "",
                stage: Stage | None = None, head: int | None = None, columns: list[int] | None = None) -> str:
        """A canvas (drawn by the script, with its colorbar) and its caption.

        ``group``: draw a separator every ``group`` columns (heads); ``from_zero``: a sequential
        scale starts at 0 (probabilities) rather than at the smallest value; ``scales``: the
        colour scale per mode of ``SCALE_MODES`` (attention maps), else the map's own range.
        ``stage``: the stage the rows are (its record drawn and explained: ``head``'s map, the features
        ``columns``); without one the rows are carried in the map (the overview).
        """
        F = rows.shape[1]
        shown = rows[:, :MAX_COLUMNS]
        vmin, vmax = value_range(shown, sequential, from_zero)
        where = ({"stage": stage.name, "head": head, "columns": columns} if stage is not None
                 else {"rows": json_numbers(shown), "name": caption})
        self.maps.append({
            **where, "rowLabels": row_labels, "colLabels": col_labels[:MAX_COLUMNS] if col_labels else None,
            "vmin": vmin, "vmax": vmax, "sequential": sequential, "decimals": self.decimals, "group": group,
            **({"scales": scales} if scales else {}),
        })
        more = f" (first {MAX_COLUMNS} of {F} columns)" if F > MAX_COLUMNS else ""
        head_title = f"<b>{_e(title)}</b> " if title else ""
        return (
            f'<figure><div class="scroll"><canvas class="heatmap" data-map="{len(self.maps) - 1}">'
            f"</canvas></div><figcaption>{head_title}{_e(caption + more)}</figcaption></figure>"
        )

    def colorbar(self, scales: dict[str, tuple[float, float]], sequential: bool) -> str:
        """One colorbar for maps sharing a scale (hidden while each head has its own)."""
        self.bars.append({"scales": scales, "sequential": sequential, "decimals": self.decimals})
        index = len(self.bars) - 1
        return f'<figure class="bar"><canvas class="colorbar" data-bar="{index}"></canvas></figure>'

    def attention(self, stage: Stage) -> str:
        """One map per head (query rows, key columns), labelled by layer and head, on a colour scale
        shared by the layer's heads (or per head, or per model: the page's control)."""
        t = self.trace
        sequential = stage.kind == "attn.weights"
        labels = [f"{p} {t.tokens[p]}" for p in stage.positions]
        keys = [f"{k} {tok}" for k, tok in enumerate(t.tokens)]
        layer = {"layer": value_range(stage.heads, sequential), "model": self.model_ranges[stage.kind]}
        self.record(stage, list(range(stage.rows.shape[1])))
        maps = [self.heatmap(stage.heads[h], labels, keys, sequential, "",
                             scales={**layer, "head": value_range(stage.heads[h], sequential)},
                             title=f"layer {stage.block} · head {h}", stage=stage, head=h)
                for h in range(stage.heads.shape[0])]
        note = ('<p class="note">one map per head: query rows, key columns; the colour scale is the '
                "page's choice (top), by default shared by the layer's heads</p>")
        return f'{note}<div class="heads">{"".join(maps)}{self.colorbar(layer, sequential)}</div>'


def _table(headers: list[str], rows: list[list[str]], caption: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f'<table class="stats">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _stats_table(trace: Trace, stage: Stage, d: int) -> str:
    headers = ["pos", "token", "mean", "var", "std", "min", "max", "L2"]
    rows = []
    for i, p in enumerate(stage.positions):
        row = [str(p), trace.tokens[p], *(fmt(float(stage.stats[k][i]), d) for k in STAT_NAMES)]
        if stage.frac_le_zero is not None:
            row.append(f"{100 * float(stage.frac_le_zero[i]):.1f}%")
        rows.append(row)
    if stage.frac_le_zero is not None:
        headers.append("<= 0")
    return _table(headers, rows, "per position")


def _norm_table(trace: Trace, stage: Stage, d: int) -> str:
    n = stage.norm
    rows = [[str(p), trace.tokens[p], *norm_cells(n, i, d)] for i, p in enumerate(stage.positions)]
    return _table(["pos", "token", *norm_headers(n.variant)], rows,
                  f"{stage.norm_module}, eps {n.eps:g}: the numbers it used")


def _section(page: Page, stage: Stage) -> str:
    t, d = page.trace, page.decimals
    labels = [f"{p} {t.tokens[p]}" for p in stage.positions]
    shape = "(" + ", ".join(map(str, stage.shape)) + ")"
    parts = [f'<section class="stage kind-{_e(stage.kind.replace(".", "-"))}" id="{_e(stage.name)}">',
             f"<h3>{_e(stage.name)} <span class=\"shape\">shape {shape}</span></h3>",
             f'<p class="explain">{_e(stage.explanation)}</p>']
    if stage.kind == "loss":
        parts.append(f'<p class="loss">loss = {fmt(float(stage.rows[0, 0]), d)}</p></section>')
        return "".join(parts)
    if stage.heads is not None:
        parts.append(page.attention(stage))
    else:
        F = stage.rows.shape[1]
        columns = shown_columns(stage, stage.rows, min(F, MAX_COLUMNS))  # a vocabulary: its largest
        cols = column_labels(stage, F) if stage.columns is not None else None
        sequential = stage.kind == "probs"
        what = "after gamma/beta" if stage.norm is not None else "values"
        group = stage.shape[-1] if stage.kind in PER_HEAD_KINDS else 0
        caption = f"{what}: positions x {F} features"
        if len(columns) < F:  # a vocabulary wider than a map: the largest at the last position, in order
            caption += f" (the {len(columns)} largest at position {stage.positions[-1]})"
        shown_labels = [cols[j] for j in columns] if cols else None
        page.record(stage, columns)  # its values at the shown columns, as the map draws them
        parts.append(page.heatmap(stage.rows[:, columns], labels, shown_labels, sequential, caption, group,
                                  stage=stage, columns=columns))
    parts.append(_stats_table(t, stage, d))
    if stage.parts is not None:
        rows = [[str(p), t.tokens[p], *parts_cells(stage.parts, i, d)] for i, p in enumerate(stage.positions)]
        parts.append(_table(["pos", "token", *PARTS_HEADERS], rows, PARTS_TITLE))
    if stage.norm is not None:
        parts.append(_norm_table(t, stage, d))
    parts.append("</section>")
    return "".join(parts)


def _overview(page: Page) -> str:
    """The residual stream's L2 norm per position through the whole model."""
    t = page.trace
    # post-norm blocks normalize the stream itself; elsewhere a norm's output feeds a sublayer (or the head)
    kinds = STREAM_KINDS + (("norm",) if LAYOUTS[t.config.norm_position].norm_on_stream else ())
    stream = [s for s in t.stages if s.kind in kinds and s.name != "ln_f" and s.positions == t.positions]
    if not stream:
        return ""
    rows = torch.stack([s.stats["l2"] for s in stream])  # (stages, P)
    labels = [f"{p} {t.tokens[p]}" for p in t.positions]
    caption = "L2 norm of each position's vector (columns) at each stream stage (rows)"
    figure = page.heatmap(rows, [s.name for s in stream], labels, True, caption, from_zero=False)
    return (f'<section class="overview" id="overview"><h2>The residual stream, stage by stage</h2>{figure}'
            "</section>")


def render_html(trace: Trace, decimals: int = 4) -> str:
    """The whole page as a string."""
    page = Page(trace, decimals)
    c = trace.config
    overview = _overview(page)
    body, toc, block = [], [], "start"
    for stage in trace.stages:
        if stage.block != block:
            block = stage.block
            title, anchor = ((f"Block {block} · {c.block_formula}", f"block-{block}")
                             if block is not None else
                             (("Input", "input") if not body else ("After the blocks", "after-the-blocks")))
            body.append(f'<h2 class="block" id="{anchor}">{_e(title)}</h2>')
            toc.append(f'<li class="group"><a href="#{anchor}">{_e(title.split(" · ")[0])}</a></li>')
        body.append(_section(page, stage))
        toc.append(f'<li><a href="#{_e(stage.name)}">{_e(stage.short)}</a></li>')
    if trace.predictions and shows_predictions(trace):
        body.append('<h2 class="block" id="predictions">Predictions</h2>'
                    + "".join(f'<section class="predictions" id="{anchor}">'
                              f"{_table(headers, rows, title)}</section>"
                              for anchor, (title, headers, rows) in
                              (("top-k", top_k_table(trace, trace.predictions, page.decimals)),
                               ("logit-lens", lens_table(trace)))))
        toc += ['<li class="group"><a href="#predictions">Predictions</a></li>',
                '<li><a href="#top-k">top k</a></li>', '<li><a href="#logit-lens">logit lens</a></li>']
    chips = "".join(f'<span class="tok"><b>{i}</b>{_e(tok)}</span>' for i, tok in enumerate(trace.tokens))
    model = (f"{c.n_layers} {LAYOUTS[c.norm_position].title} blocks · d_model {c.d_model} · "
             f"{c.n_heads} heads · d_ff {c.d_ff} · {c.activation} · norm {c.norm} · residual {c.residual} · "
             f"vocab {c.vocab_size}")
    target = (f"<p>target <b>{_e(trace.target['token'])}</b> at position {trace.target['position']}</p>"
              if trace.target else "")
    data = json.dumps({"maps": page.maps, "bars": page.bars, "stages": page.stages},
                      separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return TEMPLATE.format(
        title=_e(f"blocklab trace · {' '.join(trace.tokens)}"), css=CSS, script=HEATMAP_JS + SCRIPT,
        data=data, source=_e(trace.source), model=_e(model),
        notes="".join(f'<p class="note"><b>note:</b> {_e(note)}</p>' for note in trace.notes), chips=chips,
        target=target, overview=overview,
        toc="".join(toc), body="".join(body), scale=_scale_control() if page.bars else "",
    )


def _scale_control() -> str:
    """The attention maps' colour scale: one per layer (default), per head or per model."""
    options = "".join(
        f'<label title="{_e(words)}"><input type="radio" name="scale" value="{mode}"'
        f'{" checked" if i == 0 else ""}> {_e(words.split(":")[0])}</label>'
        for i, (mode, words) in enumerate(SCALE_MODES.items()))
    return f'<form class="scale" id="scale"><b>attention colour scale:</b> {options}</form>'


def write_html(trace: Trace, path: str | Path, decimals: int = 4) -> None:
    """Write the page to ``path``."""
    Path(path).write_text(render_html(trace, decimals), encoding="utf-8")


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body>
<nav id="toc"><div class="brand">blocklab trace</div>
<ul><li class="group"><a href="#overview">Overview</a></li>{toc}</ul></nav>
<main>
<header><h1>Every number of one forward pass</h1>
<p class="source">{source}</p>{notes}<p class="model">{model}</p>
<div class="tokens">{chips}</div>{target}
</header>
{scale}
{overview}
{body}
</main>
<div id="tip" hidden></div>
<script type="application/json" id="maps">{data}</script>
<script>{script}</script>
</body></html>
"""

CSS = """
:root { --ink: #1d2433; --muted: #667085; --line: #e4e7ec; --card: #fff; --bg: #f5f6f8; --accent: #3056d3; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       background: var(--bg); }
#toc { position: fixed; top: 0; bottom: 0; left: 0; width: 210px; overflow-y: auto; padding: 16px 12px;
       background: #101828; color: #d0d5dd; font-size: 12.5px; }
#toc .brand { font-weight: 700; color: #fff; font-size: 15px; margin-bottom: 10px; }
#toc ul { list-style: none; margin: 0; padding: 0; }
#toc li a { color: #d0d5dd; text-decoration: none; display: block; padding: 1px 6px; border-radius: 4px;
            font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
#toc li a:hover { background: #1d2939; color: #fff; }
#toc li.group { margin-top: 10px; }
#toc li.group a { font-family: inherit; font-weight: 600; color: #fff; }
main { margin-left: 210px; padding: 20px 28px 60px; max-width: 1320px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
.source, .model { margin: 2px 0; color: var(--muted); }
.note { margin: 6px 0; padding: 6px 10px; background: #fff4d6; border-left: 4px solid #d99a00; }
.tokens { margin: 10px 0 4px; display: flex; flex-wrap: wrap; gap: 6px; }
.tok { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 3px 9px;
       font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 15px; }
.tok b { color: var(--muted); font-weight: 500; font-size: 11px; margin-right: 6px; }
h2.block { margin: 34px 0 10px; font-size: 17px; padding-bottom: 6px;
           border-bottom: 2px solid var(--accent); }
section.stage, section.overview { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
       padding: 12px 16px 14px; margin: 12px 0; box-shadow: 0 1px 2px rgba(16,24,40,.04); }
section.overview h2 { margin: 0 0 8px; font-size: 16px; }
h3 { margin: 0 0 2px; font: 600 14.5px ui-monospace, SFMono-Regular, Menlo, monospace; color: var(--accent); }
h3 .shape { color: var(--muted); font-weight: 400; font-size: 12.5px; margin-left: 8px; }
.explain { margin: 2px 0 10px; font-style: italic; }
.loss { font-size: 16px; font-weight: 600; }
figure { margin: 6px 0 10px; }
.scroll { overflow-x: auto; max-width: 100%; }
canvas.heatmap { display: block; }
canvas.heatmap:focus-visible { outline: 2px solid var(--accent); outline-offset: -2px; }
figcaption { color: var(--muted); font-size: 12px; margin-top: 3px; display: flex; align-items: center;
             gap: 8px; }
.heads { display: flex; flex-wrap: wrap; gap: 6px 22px; align-items: flex-start; }
.heads figure { flex: 0 0 auto; }
.heads figcaption b { color: var(--ink); font-weight: 600; }
figure.bar { align-self: center; }
.note { color: var(--muted); font-size: 12px; margin: 2px 0 4px; }
form.scale { margin: 10px 0 0; font-size: 13px; display: flex; flex-wrap: wrap; gap: 4px 14px;
             align-items: center; position: sticky; top: 0; background: var(--bg); padding: 6px 0;
             z-index: 5; }
form.scale label { cursor: pointer; }
table.stats { border-collapse: collapse; font: 12px ui-monospace, SFMono-Regular, Menlo, monospace;
              margin: 4px 0 8px; }
table.stats caption { text-align: left; color: var(--muted); font: 12px system-ui, sans-serif;
                      padding-bottom: 2px; }
table.stats th { font-weight: 600; text-align: right; padding: 2px 10px; border-bottom: 1px solid var(--line);
       background: #f9fafb; }
table.stats td { text-align: right; padding: 1px 10px; border-bottom: 1px solid #f2f4f7; }
table.stats td:nth-child(2), table.stats th:nth-child(2) { text-align: left; }
#tip { position: fixed; pointer-events: none; background: #101828; color: #fff; padding: 4px 8px;
       border-radius: 5px; font: 12px ui-monospace, monospace; z-index: 10; white-space: pre; }
"""

# The page's own layout: how wide each map's cells are, the attention colour scale control and the shared
# colorbars; drawing, colours and hover are heatmap.js's (blocklabHeatmap).
SCRIPT = r"""
(function () {
  "use strict";
  var H = blocklabHeatmap, data = JSON.parse(document.getElementById("maps").textContent);
  var tip = document.getElementById("tip");
  var mode = "layer";  // the attention maps' colour scale (SCALE_MODES in html.py)
  data.maps.forEach(function (m) {  // a stage's map draws its record's numbers and explains them
    if (!m.stage) { return; }
    var s = data.stages[m.stage];
    m.rows = H.rows(s, m.head, null);  // the record holds the shown columns only
    m.how = H.explain(data.stages, s, m.head, m.decimals);
    m.name = H.title(s, m.head);
  });
  function scaleOf(m) { return m.scales ? m.scales[mode] : [m.vmin, m.vmax]; }
  function size(canvas, m) {  // cells as large as the section's width allows
    var C = m.rows[0].length, R = m.rows.length, cw;
    var box = canvas.closest("section") || document.body, avail = Math.max(240, box.clientWidth - 40);
    if (m.scales) {  // as many heads side by side as fit with cells of 10 px or more, then as wide as allowed
      var heads = canvas.closest(".heads").querySelectorAll("canvas.heatmap").length;
      var room = avail - (m.bar ? 0 : 100), side = H.margins(m);  // a shared colorbar takes one slot
      var beside = side.left + side.right + 22;
      var perRow = Math.max(1, Math.min(heads, Math.floor(room / (beside + 10 * C))));
      cw = Math.max(4, Math.min(28, Math.floor((room / perRow - beside) / C)));
    } else {
      cw = H.fit(m, avail, m.colLabels ? 44 : 26);
    }
    return { cw: cw, ch: R > 30 ? 10 : Math.max(12, Math.min(17, cw)) };
  }
  function draw(canvas, m) {
    m.range = scaleOf(m);
    m.bar = !m.scales || mode === "head";
    H.draw(canvas, m, size(canvas, m));
  }
  function drawBar(canvas, bar) {
    canvas.parentNode.hidden = mode === "head";  // each head then shows its own
    if (mode === "head") { return; }
    var range = bar.scales[mode], Ht = 150, W = 8 + H.barRoom(range[0], range[1], bar.decimals);
    var dpr = window.devicePixelRatio || 1;
    canvas.dataset.range = range[0] + "," + range[1];
    canvas.width = W * dpr; canvas.height = Ht * dpr;
    canvas.style.width = W + "px"; canvas.style.height = Ht + "px";
    var g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, W, Ht);
    H.colorbar(g, 4, 6, Ht - 12, range[0], range[1], bar.sequential, bar.decimals);
  }
  var canvases = document.querySelectorAll("canvas.heatmap");
  var bars = document.querySelectorAll("canvas.colorbar");
  function drawAll(first) {
    for (var i = 0; i < canvases.length; i++) {
      var m = data.maps[+canvases[i].dataset.map];
      if (first || m.scales) { draw(canvases[i], m); }
      if (first) { H.hover(canvases[i], tip, m.name || "", m, m.how || null); }
    }
    for (var j = 0; j < bars.length; j++) { drawBar(bars[j], data.bars[+bars[j].dataset.bar]); }
    document.documentElement.setAttribute("data-scale", mode);
  }
  var form = document.getElementById("scale");
  var asked = /scale=(layer|head|model)/.exec(window.location.hash);  // a link may choose the scale
  if (form && asked) { mode = asked[1]; form.querySelector("input[value=" + mode + "]").checked = true; }
  drawAll(true);
  if (form) {
    form.addEventListener("change", function (e) { mode = e.target.value; drawAll(false); });
  }
  document.documentElement.setAttribute("data-rendered", String(canvases.length));
})();
"""
