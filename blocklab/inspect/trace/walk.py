"""The tutorial walk: one forward pass as the tutorials teach it, step by step, each step a matrix.

``walk_steps(trace)`` reads a trace of every position (collect.py's stages, in forward order) and spells
each stage out in the steps a learner computes by hand: q, k and v split per head; the scores as QK^T,
then over sqrt(d_k), then masked (-inf), then softmax's exp and its row sums, then the weights; each
head's weights @ V, their concatenation, Wo; the residual sums; a norm's mu, var, denominator, z_hat,
gamma and beta; W1 x + b1, the activation, W2; the logits. The steps that are no hook stage (QK^T before
the scale, the exp, the row sums) are derived here from cached stages (the q and k the scores read, the
masked scores); every other number is the stage's own. text.py prints them as grids; explore's page draws
the derived ones (``walk_to_dict``) as maps with their numbers in their stage's card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ...nn.layouts import LAYOUTS
from ...nn.norm_kinds import NORM_KINDS
from ...nn.position_kinds import POSITION_KINDS
from .collect import json_numbers
from .operands import qk_stages
from .record import NormNumbers, Stage, Trace
from .text import fmt, grid, to_text

GRID_COLUMNS = 64  # a step this wide or narrower is printed number by number (the tutorial's d_ff is 64)
WALK_TOKENS = 32  # explore shows the derived steps for inputs of at most this many tokens


@dataclass
class WalkStep:
    """One step: ``values`` (R, C) with its row and column labels, what it is (``title``) and how it is
    computed (``formula``), the trace stage it belongs to (``stage``)."""

    title: str
    formula: str
    values: Tensor
    rows: list[str]
    columns: list[str]
    stage: str
    derived: bool = False  # a number no hook stage holds (QK^T, exp, a norm's mu): explore draws it too


def _heads(stage: Stage, n: int) -> list[Tensor]:
    """A per-head stage's rows (P, n d) split into its ``n`` heads (P, d)."""
    return list(stage.rows.split(stage.rows.shape[1] // n, dim=1))


def _features(n: int, prefix: str = "") -> list[str]:
    return [f"{prefix}{j}" for j in range(n)]


def make_step(title: str, formula: str, values: Tensor, rows: list[str], columns: list[str] | None,
              stage: str, per_row: bool = True, derived: bool = False) -> WalkStep:
    """A step of ``values``: a matrix (R, C) as it is; a vector one number per row (``per_row``: a row
    statistic such as mu) or one row (a parameter such as gamma); columns numbered when not named."""
    values = values if values.dim() == 2 else values.reshape(-1, 1) if per_row else values[None]
    columns = columns if columns is not None else _features(values.shape[1])
    return WalkStep(title, formula, values, rows, columns, stage, derived)


def norm_steps(n: NormNumbers, name: str, module: str, output: Tensor, rows: list[str],
               stage: str) -> list[WalkStep]:
    """A per-position norm's steps for its input rows: the input, mu (a kind that centres), var (or the mean
    square), the denominator with its eps, z_hat, gamma and beta (where the norm has them), the output."""
    kind = NORM_KINDS[n.variant]

    def step(title: str, formula: str, values: Tensor, columns: list[str] | None = None,
             labels: list[str] | None = None, derived: bool = True) -> WalkStep:
        return make_step(f"{name}: {title}", formula, values, labels or rows, columns, stage, labels is None,
                         derived)

    steps = [step("input", f"the {module}'s input", n.x, derived=False)]
    if kind.centres:
        steps.append(step("mu", "the mean of each row", n.mu, ["mu"]))
    steps += [step(kind.var_name, f"{kind.var_name} of each row (divided by d)", n.var, [kind.var_name]),
              step(kind.denominator, f"eps = {n.eps:g}", n.denom, ["denom"]),
              step("z_hat", ("(x - mu) / " if kind.centres else "x / ") + "denom", n.z_hat)]
    for param, what in ((n.gamma, "gamma"), (n.beta, "beta")):
        if param is not None:
            steps.append(step(what, f"the norm's {what}, one per feature", param, labels=[what]))
    scaled = "gamma * z_hat" if n.gamma is not None else "z_hat (no gamma)"  # OLMo's norm has none
    steps.append(step("output", scaled + (" + beta" if n.beta is not None else ""), output, derived=False))
    return steps


class _Walker:
    """Builds the steps of one trace; one method per stage kind that has steps (``KINDS``)."""

    def __init__(self, trace: Trace) -> None:
        self.trace, self.c = trace, trace.config
        self.tokens = [trace.tokens[p] for p in trace.positions]
        self.keys = list(trace.tokens)
        self.steps: list[WalkStep] = []

    def add(self, stage: Stage, title: str, formula: str, values: Tensor, columns: list[str] | None = None,
            rows: list[str] | None = None, derived: bool = False) -> None:
        self.steps.append(make_step(title, formula, values, rows or self.tokens, columns, stage.name,
                                    per_row=rows is None, derived=derived))

    def where(self, stage: Stage) -> str:
        return "" if stage.block is None else f"block {stage.block}: "

    def tok(self, s: Stage) -> None:
        scale = {"none": "", "sqrt_d_model": f" * sqrt(d_model) = * {math.sqrt(self.c.d_model):g}"}.get(
            self.c.embed_scale, f" * {self.c.embed_scale}")
        self.add(s, "token embeddings", f"E[t]{scale}: each token's row of the embedding table", s.rows)

    def pos(self, s: Stage) -> None:
        self.add(s, "positions", f"PE[p] ({self.c.pos_encoding})", s.rows)

    def embed(self, s: Stage) -> None:
        self.add(s, "x0", "token embedding + position", s.rows)

    def qkv(self, s: Stage) -> None:
        letter = s.kind[-1]
        n = self.c.n_heads if letter == "q" else self.c.n_kv_heads or self.c.n_heads
        for h, part in enumerate(_heads(s, n)):
            self.add(s, f"{self.where(s)}{letter.upper()}, head {h}",
                     f"x W{letter}^T + b{letter}, head {h}'s {part.shape[1]} columns", part)

    def scores(self, s: Stage) -> None:
        have = {t.name: t for t in self.trace.stages}
        read = qk_stages(f"blocks.{s.block}.", set(have))  # the q and k the scores multiply, if traced
        divisor, named = self.c.score_divisor  # sqrt(d_k), or the model's own (Gemma 2, GPT-Neo: 1)
        cap = self.c.attn_softcap
        for h in range(s.heads.shape[0]):
            where = f"{self.where(s)}head {h}"
            if len(read) == 2 and all(r in have for r in read) and len(self.tokens) == len(self.keys):
                q = _heads(have[read[0]], s.heads.shape[0])[h]
                k_heads = _heads(have[read[1]], have[read[1]].rows.shape[1] // q.shape[1])
                k = k_heads[h * len(k_heads) // s.heads.shape[0]]
                scaled = q @ k.T / divisor
                self.add(s, f"{where}: QK^T", f"Q K^T, before the scale (d_k = {q.shape[1]})", q @ k.T,
                         self.keys, derived=True)
                self.add(s, f"{where}: scaled", f"Q K^T / {named} = / {divisor:.6g}", scaled, self.keys,
                         derived=True)
                if cap is not None:  # Gemma 2: cap tanh(scaled / cap), before the bias and the mask
                    self.add(s, f"{where}: soft-capped", f"{cap:g} tanh(scaled / {cap:g})",
                             cap * torch.tanh(scaled / cap), self.keys, derived=True)
            before = "soft-capped" if cap is not None else "scaled"
            alibi = " - m_h |i - j| (ALiBi)" if POSITION_KINDS[self.c.pos_encoding].alibi else ""
            window = self.c.window(s.block) if s.block is not None else None
            local = f" (a local layer: it sees the last {window} keys)" if window else ""
            masked = (f"{before}{alibi} + mask: -inf where a query may not see the key{local}"
                      if self.c.causal else f"{before}{alibi} (no mask)")
            self.add(s, f"{where}: masked", masked, s.heads[h], self.keys)
            exp = torch.exp(s.heads[h])  # exp(-inf) = 0: a masked key gets no weight
            self.add(s, f"{where}: exp", "softmax, step 1: exp of each score", exp, self.keys, derived=True)
            self.add(s, f"{where}: row sums", "softmax, step 2: each query's sum of exp", exp.sum(-1),
                     ["sum"], derived=True)

    def weights(self, s: Stage) -> None:
        for h in range(s.heads.shape[0]):
            self.add(s, f"{self.where(s)}head {h}: weights", "softmax, step 3: exp / row sum", s.heads[h],
                     self.keys)

    def z(self, s: Stage) -> None:
        for h, part in enumerate(_heads(s, self.c.n_heads)):
            self.add(s, f"{self.where(s)}head {h}: weights @ V", f"head {h}'s weights times its V", part)
        d = s.rows.shape[1] // self.c.n_heads
        self.add(s, f"{self.where(s)}concatenation", "the heads side by side: [head 0 | head 1 | ...]",
                 s.rows, [f"h{j // d}:{j % d}" for j in range(s.rows.shape[1])])

    def linear(self, s: Stage) -> None:
        formula, title = LINEARS[s.kind]
        self.add(s, f"{self.where(s)}{title}", formula.format(act=self.c.activation), s.rows)

    def residual(self, s: Stage) -> None:
        step = next(t for t in LAYOUTS[self.c.norm_position].sums if t.name == s.short)
        self.add(s, f"{self.where(s)}residual sum {s.short}",
                 f"{step.x} + {' + '.join(step.branches)} (residual {self.c.residual})", s.rows)

    def norm(self, s: Stage) -> None:
        if s.norm is None:  # an identity (no norm: the ablation, or a post-norm stack's ln_f) or no LayerNorm
            if s.norm_module:
                self.add(s, f"{self.where(s)}{s.short}", f"{s.norm_module}", s.rows)
            return
        name = f"{self.where(s)}{s.short}"
        self.steps += norm_steps(s.norm, name, s.norm_module, s.rows, self.tokens, s.name)

    def logits(self, s: Stage) -> None:
        self.add(s, "logits", "x W_vocab^T: a score per vocabulary token", s.rows, s.columns)

    def probs(self, s: Stage) -> None:
        self.add(s, "probabilities", "softmax(logits)", s.rows, s.columns)


# the Linear stages: (formula, title); {act} is the activation's name
LINEARS = {
    "attn.out": ("concatenation Wo^T + bo", "Wo"),
    "ffn.hidden": ("x W1^T + b1", "W1 x + b1"),
    "ffn.linear": ("x W3^T + b3 (the gate's partner)", "W3 x"),
    "ffn.act": ("{act}(hidden), feature by feature", "activation"),
    "ffn.out": ("activation W2^T + b2", "W2"),
}
KINDS = {
    "tok": _Walker.tok, "pos": _Walker.pos, "embed": _Walker.embed,
    "attn.q": _Walker.qkv, "attn.k": _Walker.qkv, "attn.v": _Walker.qkv,
    "attn.scores": _Walker.scores, "attn.weights": _Walker.weights, "attn.z": _Walker.z,
    **dict.fromkeys(LINEARS, _Walker.linear),
    "resid_mid": _Walker.residual, "resid_post": _Walker.residual,
    "norm": _Walker.norm, "logits": _Walker.logits, "probs": _Walker.probs,
}


def walk_steps(trace: Trace) -> list[WalkStep]:
    """The trace's stages spelled out as the tutorials teach them, in forward order (module docstring);
    stages no tutorial step shows (resid_pre, each head's Wo share, the loss) are left out."""
    walker = _Walker(trace)
    for stage in trace.stages:
        if stage.kind in KINDS:
            KINDS[stage.kind](walker, stage)
    return walker.steps


def walk_to_dict(trace: Trace) -> list[dict]:
    """The walk's derived steps (the numbers no stage holds: QK^T, scaled, exp, row sums, a norm's mu, var,
    denominator, z_hat, gamma and beta) as JSON for explore, each under its stage; none for an input longer
    than ``WALK_TOKENS`` (the steps are the tutorial's, for inputs a learner reads number by number)."""
    if len(trace.tokens) > WALK_TOKENS:
        return []
    return [step_to_dict(step) for step in walk_steps(trace) if step.derived]


def step_to_dict(step: WalkStep) -> dict:
    """One step as JSON (explore's page, ``blocklab explain --json``): non-finite numbers as null."""
    return {"stage": step.stage, "title": step.title, "formula": step.formula, "rows": step.rows,
            "columns": step.columns, "values": json_numbers(step.values)}


def step_grids(step: WalkStep, decimals: int, width: int, corner: str = "token") -> list:
    """One step as grids of its numbers in column chunks that fit ``width``, rows labelled under ``corner``
    (by token); a step wider than ``GRID_COLUMNS``: each row's min, mean, max and L2 instead."""
    values, columns = step.values, step.columns
    if values.shape[1] > GRID_COLUMNS:
        finite = torch.where(torch.isfinite(values), values, torch.zeros((), dtype=values.dtype))
        values = torch.stack([values.amin(1), finite.mean(1), values.amax(1), finite.norm(dim=1)], 1)
        columns = ["min", "mean", "max", "L2"]
    cells = [[fmt(float(v), decimals) for v in row] for row in values]
    cell_w = max([len(c) for row in cells for c in row] + [len(c) for c in columns])
    label_w = max(len(r) for r in [*step.rows, corner])
    per = max(1, (width - label_w) // (cell_w + 2))
    return [grid("", [corner, *(c.rjust(cell_w) for c in columns[start:start + per])],
                 [[label.ljust(label_w), *(c.rjust(cell_w) for c in row[start:start + per])]
                  for label, row in zip(step.rows, cells, strict=True)])
            for start in range(0, len(columns), per)]


def render_steps(steps: list[WalkStep], console, decimals: int, width: int, corner: str = "token") -> None:
    """Print steps: each numbered, its title and formula, then its numbers (``step_grids``)."""
    from rich.text import Text

    wide = f" (wider than {GRID_COLUMNS}: each row's min, mean, max, L2)"
    for i, step in enumerate(steps, 1):
        heading = Text.assemble((f"{i}. {step.title}", "bold cyan"), "  ", (step.formula, "dim"),
                                (wide if step.values.shape[1] > GRID_COLUMNS else "", "dim"))
        console.print(heading)
        for g in step_grids(step, decimals, width, corner):
            console.print(to_text(g))


def render_walk(trace: Trace, console, decimals: int, width: int) -> None:
    """Print the walk of a trace (``render_steps`` of ``walk_steps``)."""
    render_steps(walk_steps(trace), console, decimals, width)
