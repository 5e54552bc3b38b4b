"""How each number of a stage was computed, with its operands: what the pages show on hover.

One ``Operands`` record per stage that has a formula over other stages (and the model's weights):

    sum       resid_mid[t, j] = resid_pre[t, j] + attn.out[t, j]      the layout's Sum, residual 'add'
    act       ffn.act[t, j] = act(ffn.hidden[t, j])
    gated     ffn.act[t, j] = gate(ffn.hidden[t, j]) * ffn.linear[t, j]     (SwiGLU, GeGLU)
    softmax   attn.weights[h, t, k] = the softmax over k of attn.scores[h, t, :]
    dot       attn.q[t, j] = ln1[t] . Wq[j] + bq[j]   (k, v; logits with the vocabulary matrix)

Operands that are stages are named (``reads``): their numbers are in the trace. Numbers that are no
stage are carried: the gate's values gate(h), and for a dot product its largest terms x_i W[j, i]
(the ``TERMS`` largest in size, with i, x_i and W[j, i]), the sum of the other terms and the bias,
so the shown terms + the rest + the bias add up to the stage's number. They are read from the
forward's own cache and the model's own weights and functions (the input stage as cached, the
module's Linear weight, the FFN's gate), in float64: nothing of the forward is re-implemented.

Norms need no record: their stage carries z_hat, mu and the denominator (``Stage.norm``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...nn.activation_kinds import activation_kind
from ...nn.config import ModelConfig
from ...nn.layouts import LAYOUTS
from .record import MAX_COLUMNS, Operands, Stage
from .text import shown_columns

TERMS = 3  # a dot product's terms shown, the largest in size first
# a stage whose numbers are dot products: the Linear it applies (its path in the block or the model),
# the names the formula gives its weight and bias (explain.py's words), and the sublayer whose input it
# reads (None: the final norm's output, ln_f)
DOT_STAGES: dict[str, tuple[str, str, str, str | None]] = {
    "attn.q": ("attn.q", "Wq", "bq", "attn"),
    "attn.k": ("attn.k", "Wk", "bk", "attn"),
    "attn.v": ("attn.v", "Wv", "bv", "attn"),
    "logits": ("head", "W_vocab", "b_vocab", None),
}


def sources(config: ModelConfig, names: list[str]) -> dict[str, str]:
    """Each stage among ``names`` whose record reads a cached stage -> that stage: a dot product's input
    (the layout's attention input for q, k and v; ln_f for the logits), the FFN's hidden stage for its
    gate. They are cached with the trace even when not shown."""
    reads = LAYOUTS[config.norm_position].sublayer("attn").reads
    out = {}
    for name in names:
        parts = name.split(".")
        kind = ".".join(parts[2:]) if parts[0] == "blocks" else name
        if kind in DOT_STAGES:
            out[name] = f"blocks.{parts[1]}.{reads}" if DOT_STAGES[kind][3] else "ln_f"
        elif kind == "ffn.act":
            out[name] = f"blocks.{parts[1]}.ffn.hidden"
    return out


def dot(x: Tensor, linear: nn.Linear, columns: list[int] | None) -> dict[str, Tensor]:
    """The terms of ``x (P, n) @ linear.weight[columns].T + bias``: the ``TERMS`` largest in size per
    number, the rest's sum and the bias, in float64. One position at a time (a (C, n) product each)."""
    weight = linear.weight.detach().to(torch.float64)
    if columns is not None:
        weight = weight[columns]
    k = min(TERMS, weight.shape[1])
    index, xs, ws, rest = [], [], [], []
    for row in x.to(torch.float64):
        terms = row[None, :] * weight  # (C, n): x_i W[j, i]
        top = terms.abs().topk(k, dim=-1).indices  # (C, K)
        index.append(top)
        xs.append(row[top])
        ws.append(weight.gather(1, top))
        rest.append(terms.sum(-1) - terms.gather(1, top).sum(-1))
    bias = linear.bias
    if bias is not None:
        bias = bias.detach().to(torch.float64)
        bias = bias[columns] if columns is not None else bias
    return {"index": torch.stack(index), "x": torch.stack(xs), "w": torch.stack(ws),
            "rest": torch.stack(rest), "bias_values": bias}


def stage_operands(stage: Stage, config: ModelConfig, modules: dict[str, nn.Module],
                   cache: dict[str, Tensor], reads: dict[str, str]) -> Operands | None:
    """The record for ``stage``, or None where its numbers have no formula over other stages here.

    ``cache``: the forward's cached stages (batch of one), ``sources``' among them."""
    prefix = f"blocks.{stage.block}." if stage.block is not None else ""
    layout = LAYOUTS[config.norm_position]
    positions = stage.positions
    if stage.kind in DOT_STAGES:
        path, weight, bias, _ = DOT_STAGES[stage.kind]
        linear = modules[prefix + path]
        F = stage.rows.shape[1]
        columns = shown_columns(stage, stage.rows, min(F, MAX_COLUMNS))  # what a page shows
        columns = None if columns == list(range(F)) else columns
        source = reads[stage.name]
        terms = dot(cache[source][0, positions], linear, columns)
        return Operands("dot", [source], weight=weight, bias=bias if linear.bias is not None else "",
                        columns=columns, n=linear.weight.shape[1], **terms)
    sums = [s for s in layout.sums if s.name == stage.kind]
    if sums and stage.block is not None and config.residual == "add":  # other residuals scale x or F
        return Operands("sum", [prefix + n for n in (sums[0].x, *sums[0].branches)])
    if stage.kind == "attn.weights":
        return Operands("softmax", [prefix + "attn.scores"])
    if stage.kind == "ffn.act":
        ffn = modules[prefix + "ffn"]
        hidden = reads[stage.name]
        kind = activation_kind(ffn.activation).ffn_kind  # act(hidden), or gate(hidden) * linear
        if not kind.gated:
            return Operands(kind.operands, [hidden], function=ffn.activation)
        with torch.no_grad():
            gate = ffn.gate(cache[hidden][0, positions].to(torch.float64))
        return Operands(kind.operands, [hidden, prefix + "ffn.linear"], function=ffn.gate_name, gate=gate)
    return None
