"""The trace in the terminal: one section per stage, in forward order, as rich tables.

Each section: the stage name and shape, one line of words, the statistics per position
(rows labelled ``pos token``), the extra numbers of its kind (LayerNorm mu/var/denominator
and z_hat; the FFN's fraction <= 0; attention per head), and the vector at each position.
Numbers are printed with ``decimals`` digits after the point, the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console, Group
from rich.rule import Rule
from rich.text import Text
from torch import Tensor

from ...nn.embedding import EmbeddingParts
from ...nn.norm_kinds import NORM_KINDS
from .record import PER_HEAD_KINDS, STAT_NAMES, NormNumbers, Stage, TopK, Trace

STAT_HEADERS = {"mean": "mean", "var": "var", "std": "std", "min": "min", "max": "max", "l2": "L2"}


def fmt(value: float, decimals: int) -> str:
    """A number as printed everywhere in the trace: fixed decimals; inf/nan spelled out."""
    if math.isfinite(value):
        return f"{value:.{decimals}f}"
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


@dataclass
class Grid:
    """An aligned table as lines of text: (text, style) pairs, header bold, rule dim."""

    lines: list[tuple[str, str]]

    @property
    def width(self) -> int:
        return max(len(text) for text, _ in self.lines)


def grid(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Grid:
    """Columns right-aligned except the token column (the second), two spaces apart."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in pairs)

    head = line(headers)
    lines = [(title, "dim")] if title else []
    lines += [(head, "bold"), ("─" * len(head), "dim")] + [(line(r), "") for r in rows]
    return Grid(lines)


def side_by_side(grids: Sequence[Grid], width: int, gap: int = 4) -> list[Grid]:
    """Grids placed next to each other, as many per band as fit in ``width``."""
    bands: list[list[Grid]] = [[]]
    used = 0
    for g in grids:
        if bands[-1] and used + gap + g.width > width:
            bands.append([])
            used = 0
        used += (gap if bands[-1] else 0) + g.width
        bands[-1].append(g)
    out = []
    for band in bands:
        height = max(len(g.lines) for g in band)
        lines = []
        for i in range(height):
            cells = [g.lines[i] if i < len(g.lines) else ("", "") for g in band]
            text = (" " * gap).join(t.ljust(g.width) for (t, _), g in zip(cells, band, strict=True)).rstrip()
            lines.append((text, cells[0][1] or next((st for _, st in cells if st), "")))
        out.append(Grid(lines))
    return out


def to_text(g: Grid) -> Text:
    text = Text()
    for line, style in g.lines:
        text.append(line + "\n", style=style or None)
    return text


def _row_label(trace: Trace, position: int) -> list[str]:
    return [str(position), trace.tokens[position]]


def stats_grid(trace: Trace, stage: Stage, decimals: int) -> Grid:
    """mean, var, std, min, max, L2 per position (and the FFN's fraction <= 0)."""
    extra = ["<= 0"] if stage.frac_le_zero is not None else []
    extra += ["masked"] if stage.masked is not None else []
    rows = []
    for i, p in enumerate(stage.positions):
        cells = [fmt(float(stage.stats[k][i]), decimals) for k in STAT_NAMES]
        if stage.frac_le_zero is not None:
            cells.append(f"{100 * float(stage.frac_le_zero[i]):.1f}%")
        if stage.masked is not None:
            cells.append(str(int(stage.masked[i])))
        rows.append(_row_label(trace, p) + cells)
    return grid("per position", ["pos", "token", *(STAT_HEADERS[k] for k in STAT_NAMES), *extra], rows)


PARTS_TITLE = "x0 = tok + pos: the parts"
PARTS_HEADERS = ["||tok||", "||pos||", "token share ||tok||/(||tok||+||pos||)"]


def parts_cells(parts: EmbeddingParts, i: int, decimals: int) -> list[str]:
    """One position's token and position norms and the token share (in %)."""
    share = float(parts.tok_share[i])
    shown = f"{100 * share:.1f}%" if math.isfinite(share) else "nan"
    return [fmt(float(parts.tok_l2[i]), decimals), fmt(float(parts.pos_l2[i]), decimals), shown]


def parts_grid(trace: Trace, stage: Stage, decimals: int) -> Grid:
    """The embed stage: x0's token and position parts per position, their norms and the token share."""
    rows = [_row_label(trace, p) + parts_cells(stage.parts, i, decimals)
            for i, p in enumerate(stage.positions)]
    return grid(PARTS_TITLE, ["pos", "token", *PARTS_HEADERS], rows)


def norm_headers(variant: str, short: bool = False) -> list[str]:
    """Column names of the LayerNorm table: mu, var, the denominator, z_hat mean/var, var/denominator^2
    (``short``: the denominator called ``denom``, for a narrow terminal; the title then says what it is)."""
    kind = NORM_KINDS[variant]
    denom, var = "denom" if short else kind.denominator, kind.var_name
    return ["mu", var, denom, "z_hat mean", "z_hat var", f"{var}/{denom}^2"]


def norm_cells(n: NormNumbers, i: int, decimals: int) -> list[str]:
    """One position's LayerNorm numbers; the two variances get 4 more decimals: they sit just under 1."""
    plain = [fmt(float(v[i]), decimals) for v in (n.mu, n.var, n.denom, n.z_hat_mean)]
    return plain + [fmt(float(v[i]), decimals + 4) for v in (n.z_hat_var, n.expected_var)]


def norm_grid(trace: Trace, stage: Stage, decimals: int, width: int) -> Grid:
    """The LayerNorm's own numbers per position: mu, var, the denominator; z_hat's mean and variance (the
    last column headed in short where the table would be wider than ``width``)."""
    n = stage.norm
    rows = [_row_label(trace, p) + norm_cells(n, i, decimals) for i, p in enumerate(stage.positions)]
    title = f"{stage.norm_module}, eps {n.eps:g}: the numbers it used"
    full = grid(title, ["pos", "token", *norm_headers(n.variant)], rows)
    short = ["pos", "token", *norm_headers(n.variant, short=True)]
    denom = NORM_KINDS[n.variant].denominator
    return full if full.width <= width else grid(f"{title} (denom = {denom})", short, rows)


def column_labels(stage: Stage, features: int) -> list[str]:
    """Feature labels: vocabulary tokens (logits, probs), ``h1:5`` (head 1's feature 5: q, k, v, z, result;
    not ``1.5``, which reads as a number), else the index."""
    if stage.columns is not None:
        return list(stage.columns)
    if stage.kind in PER_HEAD_KINDS:
        d_k = stage.shape[-1]
        return [f"h{j // d_k}:{j % d_k}" for j in range(features)]
    return [str(j) for j in range(features)]


VOCAB_KINDS = ("logits", "probs")  # one feature per vocabulary token: summarised by their largest


def shown_columns(stage: Stage, rows: Tensor, shown: int) -> list[int]:
    """Which features to show when only ``shown`` fit: a vocabulary's largest at the last position (the
    tokens that matter), in that order; any other stage's first ones."""
    if stage.kind in VOCAB_KINDS and shown < rows.shape[1]:
        return rows[-1].topk(shown).indices.tolist()
    return list(range(shown))


def shows_predictions(trace: Trace) -> bool:
    """Whether the top-k and logit-lens tables are shown: with the logits stage (a trace of chosen
    stages shows those alone; its JSON still holds them)."""
    return any(s.kind == "logits" for s in trace.stages)


Table = tuple[str, list[str], list[list[str]]]  # title, headers, rows: the terminal and the page show both


def top_k_table(trace: Trace, found: Sequence[TopK], decimals: int) -> Table:
    """The model's most likely next tokens at each shown position."""
    rows = [[str(p.position), trace.tokens[p.position], str(rank + 1), repr(token), fmt(prob, decimals),
             fmt(logit, decimals)]
            for p in found
            for rank, (token, prob, logit) in enumerate(zip(p.tokens, p.probs, p.logits, strict=True))]
    ranked = [p for p in found if p.target_rank is not None]
    title = f"the {len(found[0].ids)} most likely next tokens"
    if ranked:
        t = trace.target
        title += (f"; the target {t['token']!r} ranks {ranked[0].target_rank} "
                  f"(p = {fmt(ranked[0].target_prob, decimals)})")
    return title, ["pos", "token", "rank", "next token", "p", "logit"], rows


def lens_table(trace: Trace, width: int = 0) -> Table:
    """The logit lens: each stream stage read through the final norm and the head (as many top tokens as
    fit ``width`` columns, 0: all)."""
    k = len(trace.lens[0].ids)
    while width and k > 1 and _lens_width(trace, k) > width:
        k -= 1
    ranked = trace.lens[0].target_rank is not None
    tops = [zip(lens.tokens[:k], lens.probs[:k], strict=True) for lens in trace.lens]
    rows = [[lens.stage, *(f"{t!r} {fmt(p, 2)}" for t, p in top),
             *([str(lens.target_rank)] if ranked else [])]
            for lens, top in zip(trace.lens, tops, strict=True)]
    title = (f"logit lens at {trace.label(trace.lens[0].position)}: each stream stage through the final norm "
             "and the head, its top tokens with p")
    return title, ["stage", *(f"top {i + 1}" for i in range(k)), *(["target rank"] if ranked else [])], rows


def _lens_width(trace: Trace, k: int) -> int:
    """The logit lens table's width with ``k`` top tokens per stage."""
    cells = [[len(lens.stage)] + [len(f"{t!r} 0.00") for t in lens.tokens[:k]] for lens in trace.lens]
    widths = [max(max(c[i] for c in cells), len(f"top {i}") if i else 5) for i in range(k + 1)]
    ranked = len("target rank") + 2 if trace.lens[0].target_rank is not None else 0
    return sum(widths) + 2 * k + ranked


def vector_grids(
    trace: Trace, stage: Stage, rows: Tensor, title: str, decimals: int, max_features: int, width: int
) -> list[Grid]:
    """The vectors at each position, first ``max_features`` features (0 = all), in column chunks that fit."""
    F = rows.shape[1]
    shown = F if max_features <= 0 else min(F, max_features)
    columns = shown_columns(stage, rows, shown)
    all_labels = column_labels(stage, F)
    labels = [all_labels[j] for j in columns]
    cells = [[fmt(float(row[j]), decimals) for j in columns] for row in rows]
    cell_w = max([len(c) for row in cells for c in row] + [len(lab) for lab in labels])
    labels = [lab.rjust(cell_w) for lab in labels]  # one width for every column of a vector
    per_chunk = _per_chunk(trace, stage, cell_w, width)
    if shown == F:
        note = f"{title}, {F} features"
    elif stage.kind in VOCAB_KINDS:
        note = (f"{title}, the {shown} largest at position {stage.positions[-1]} of {F} "
                "(--max-features 0 shows all)")
    else:
        note = f"{title}, features 0-{shown - 1} of {F} (--max-features 0 shows all)"
    return [
        grid(note if start == 0 else "", ["pos", "token", *labels[start:start + per_chunk]],
             [_row_label(trace, p) + cells[i][start:start + per_chunk]
              for i, p in enumerate(stage.positions)])
        for start in range(0, shown, per_chunk)
    ]


def _per_chunk(trace: Trace, stage: Stage, cell_w: int, width: int) -> int:
    """How many columns ``cell_w`` wide fit ``width`` beside the ``pos`` and ``token`` columns (each at least
    as wide as its heading), two spaces apart."""
    tokens = max([len("token")] + [len(trace.tokens[p]) for p in stage.positions])
    label_w = max(len("pos"), len(str(max(stage.positions)))) + 2 + tokens
    return max(1, (width - label_w) // (cell_w + 2))


def head_grids(trace: Trace, stage: Stage, decimals: int, width: int) -> list[Grid]:
    """One matrix per head, side by side where they fit: rows are query positions, columns keys (in
    chunks of keys where one head's matrix is wider than ``width``)."""
    heads, _, T = stage.heads.shape
    keys = [trace.tokens[k] for k in range(T)]
    cells = [[[fmt(float(v), decimals) for v in stage.heads[h, i]] for i in range(len(stage.positions))]
             for h in range(heads)]
    cell_w = max([len(c) for head in cells for row in head for c in row] + [len(k) for k in keys])
    step = _per_chunk(trace, stage, cell_w, width)
    grids = [
        grid(f"head {h}: query rows, key columns" + (f" {start}-{min(T, start + step) - 1}" * (step < T)),
             ["pos", "token", *(k.rjust(cell_w) for k in keys[start:start + step])],
             [_row_label(trace, p) + [c.rjust(cell_w) for c in cells[h][i][start:start + step]]
              for i, p in enumerate(stage.positions)])
        for h in range(heads) for start in range(0, T, step)
    ]
    return side_by_side(grids, width)


def render_stage(trace: Trace, stage: Stage, decimals: int, max_features: int, width: int) -> Text:
    """One stage: heading, words, then its grids."""
    shape = "(" + ", ".join(map(str, stage.shape)) + ")"
    text = Text.assemble((stage.name, "bold cyan"), "  ", (f"shape {shape}", "dim"), "\n",
                         (stage.explanation, "italic"), "\n")
    if stage.kind == "loss":
        return text.append(f"loss = {fmt(float(stage.rows[0, 0]), decimals)}\n", style="bold")
    for g in stage_grids(trace, stage, decimals, max_features, width):
        text.append("\n").append_text(to_text(g))
    return text


def stage_grids(trace: Trace, stage: Stage, decimals: int, max_features: int, width: int) -> list[Grid]:
    """A stage's tables, each within ``width`` columns (their titles aside, which wrap as words do)."""
    grids = [stats_grid(trace, stage, decimals)]
    if stage.parts is not None:
        grids.append(parts_grid(trace, stage, decimals))
    if stage.heads is not None:
        grids += head_grids(trace, stage, decimals, width)
    elif stage.norm is not None:
        grids.append(norm_grid(trace, stage, decimals, width))
        for rows, title in ((stage.norm.z_hat, "z_hat = (z - mu) / denominator, before gamma/beta"),
                            (stage.rows, "after gamma * z_hat + beta")):
            grids += vector_grids(trace, stage, rows, title, decimals, max_features, width)
    else:
        grids += vector_grids(trace, stage, stage.rows, "vector", decimals, max_features, width)
    return grids


def header(trace: Trace) -> Group:
    """What was traced: the model and the input."""
    c = trace.config
    model = (f"{c.n_layers} {c.block_title} blocks, d_model {c.d_model}, {c.n_heads} heads, "
             f"d_ff {c.d_ff}, {c.activation}, norm {c.norm}, residual {c.residual}, vocab {c.vocab_size}")
    lines = [
        Text.assemble(("blocklab trace", "bold"), f"  {trace.source}"),
        *(Text.assemble(("note: ", "bold yellow"), note) for note in trace.notes),
        Text(f"model: {model}"),
        Text(f"input: {' '.join(trace.tokens)}   "
             f"({len(trace.ids)} tokens; ids {' '.join(map(str, trace.ids))})"),
    ]
    if trace.target:
        t = trace.target
        lines.append(Text(f"target: {t['token']!r} (id {t['id']}) at position {t['position']}"))
    if len(trace.positions) != len(trace.ids):
        lines.append(Text(f"showing position {trace.label(trace.positions[0])}"))
    return Group(*lines, Text(""))


def render_text(
    trace: Trace, console: Console | None = None, decimals: int = 4, max_features: int = 16
) -> None:
    """Print the whole walk: header, then every stage with a rule before each block."""
    console = console or Console()
    width = console.width
    console.print(header(trace))
    block = None
    for stage in trace.stages:
        if stage.block != block:
            block = stage.block
            if block is not None:
                title = f"block {block}  ·  {trace.config.block_formula}"
                console.print(Rule(title, style="blue"))
            else:
                console.print(Rule("after the blocks", style="blue"))
        console.print(render_stage(trace, stage, decimals, max_features, width))
    if trace.predictions and shows_predictions(trace):
        console.print(Rule("predictions", style="blue"))
        for table in (top_k_table(trace, trace.predictions, decimals), lens_table(trace, width)):
            console.print(to_text(grid(*table)), "")
