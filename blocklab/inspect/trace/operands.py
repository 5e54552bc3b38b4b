"""How each number of a stage was computed, with its operands: what the pages show on hover.

One ``Operands`` record per stage that has a formula over other stages (and the model's weights):

    sum       resid_mid[t, j] = resid_pre[t, j] + attn.out[t, j]      the layout's Sum, residual 'add'
    act       ffn.act[t, j] = act(ffn.hidden[t, j])
    gated     ffn.act[t, j] = gate(ffn.hidden[t, j]) * ffn.linear[t, j]     (SwiGLU, GeGLU)
    softmax   attn.weights[h, t, k] = the softmax over k of attn.scores[h, t, :]
    dot       attn.q[t, j] = ln1[t] . Wq[j] + bq[j]   (k, v; attn.out with Wo over z; ffn.hidden with W1,
              ffn.linear with W3, ffn.out with W2 over ffn.act; logits with the vocabulary matrix)
    qk        attn.scores[h, t, k] = q[t, head h] . k[k, head h] / sqrt(d_k)     (-inf where masked)
    mix       attn.z[t, h d_k + i] = sum over the keys k of attn.weights[h, t, k] v[k, head h, i]
    head_dot  attn.result[t, h d_model + j] = z[t, head h] . Wo[j, head h's d_k columns]   (no bo)

Operands that are stages are named (``reads``): their numbers are in the trace. Numbers that are no
stage are carried: the gate's values gate(h), and for the products (dot, qk, mix, head_dot) their largest
terms a_i b_i (the ``TERMS`` largest in size, with i, a_i and b_i) and the sum of the other terms (and
a dot's bias), so the shown terms + the rest (+ the bias; qk: then over sqrt(d_k)) give the stage's
number. They are read from the forward's own cache and the model's own weights and functions (the
input stage as cached, the module's Linear weight, the FFN's gate), in float64: nothing of the forward
is re-implemented.

Norms need no record: their stage carries x, z_hat, mu, the denominator, gamma and beta
(``Stage.norm``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...nn.activation_kinds import activation_kind
from ...nn.config import ModelConfig
from ...nn.layouts import LAYOUTS
from .record import MAX_COLUMNS, Operands, Stage
from .text import shown_columns

TERMS = 3  # a product's terms shown, the largest in size first
# a stage whose numbers are dot products: the Linear it applies (its path in the block or the model),
# the names the formula gives its weight and bias (explain.py's words), and what it reads: a sublayer's
# input ("attn", "ffn": the layout's), another stage of the block, or None (the final norm's output, ln_f)
DOT_STAGES: dict[str, tuple[str, str, str, str | None]] = {
    "attn.q": ("attn.q", "Wq", "bq", "attn"),
    "attn.k": ("attn.k", "Wk", "bk", "attn"),
    "attn.v": ("attn.v", "Wv", "bv", "attn"),
    "attn.out": ("attn.o", "Wo", "bo", "attn.z"),
    "ffn.hidden": ("ffn.w1", "W1", "b1", "ffn"),
    "ffn.linear": ("ffn.w3", "W3", "b3", "ffn"),
    "ffn.out": ("ffn.w2", "W2", "b2", "ffn.act"),
    "logits": ("head", "W_vocab", "b_vocab", None),
}


def qk_stages(prefix: str, hooks: set[str]) -> list[str]:
    """The q and k the scores multiply: rotated (rotary), else normalised (QK-norm), else as projected."""
    found = [next((n for n in (f"{prefix}attn.rot_{x}", f"{prefix}attn.{x}_norm", f"{prefix}attn.{x}")
                   if n in hooks), None) for x in "qk"]
    return [n for n in found if n is not None]  # fewer than two where q or k is not among ``hooks``


def sources(model: nn.Module, names: list[str]) -> dict[str, list[str]]:
    """Each stage among ``names`` whose record reads cached stages -> those stages: a dot product's input
    (the layout's sublayer input for q, k, v and the FFN's first matrices, z for Wo, act for W2, ln_f for
    the logits), the FFN's hidden stage for its gate, q and k for the scores, the weights and v for z.
    They are cached with the trace even when not shown."""
    layout = LAYOUTS[model.config.norm_position]
    hooks = set(model.hook_names())
    out = {}
    for name in names:
        parts = name.split(".")
        prefix = f"blocks.{parts[1]}." if parts[0] == "blocks" else ""
        kind = name[len(prefix):]
        if kind in DOT_STAGES:
            read = DOT_STAGES[kind][3]
            out[name] = ([prefix + layout.sublayer(read).reads] if read in ("attn", "ffn") else
                         [prefix + read] if read else ["ln_f"])
        elif kind == "ffn.act":
            out[name] = [prefix + "ffn.hidden"]
        elif kind == "attn.scores":
            out[name] = qk_stages(prefix, hooks)
        elif kind == "attn.z":
            out[name] = [prefix + "attn.weights", prefix + "attn.v"]
        elif kind == "attn.result":
            out[name] = [prefix + "attn.z"]
    return {name: reads for name, reads in out.items() if all(r in hooks for r in reads)}


def largest_terms(a: Tensor, b: Tensor) -> dict[str, Tensor]:
    """The terms a_i b_i of the products ``sum_i a_i b_i`` (``a``, ``b`` broadcast to (..., n)): the
    ``TERMS`` largest in size (``index`` i, ``x`` a_i, ``w`` b_i; (..., K)) and the sum of the others."""
    terms = a * b
    top = terms.abs().topk(min(TERMS, terms.shape[-1]), dim=-1).indices
    return {"index": top, "x": a.expand_as(terms).gather(-1, top), "w": b.expand_as(terms).gather(-1, top),
            "rest": terms.sum(-1) - terms.gather(-1, top).sum(-1)}


def dot(x: Tensor, linear: nn.Linear, columns: list[int] | None) -> dict[str, Tensor]:
    """The terms of ``x (P, n) @ linear.weight[columns].T + bias``: the ``TERMS`` largest in size per
    number, the rest's sum and the bias, in float64. One position at a time (a (C, n) product each)."""
    weight = linear.weight.detach().to(torch.float64)
    if columns is not None:
        weight = weight[columns]
    found = [largest_terms(row[None, :], weight) for row in x.to(torch.float64)]
    bias = linear.bias
    if bias is not None:
        bias = bias.detach().to(torch.float64)
        bias = bias[columns] if columns is not None else bias
    return {**{k: torch.stack([f[k] for f in found]) for k in found[0]}, "bias_values": bias}


def _heads(x: Tensor, heads: int) -> Tensor:
    """A cached (1, h|h_kv, T, d) stage as (h, T, d) in float64: each key/value head repeated for its
    group of query heads (grouped-query attention)."""
    x = x[0].to(torch.float64)
    return x.repeat_interleave(heads // x.shape[0], dim=0)


def scores_operands(stage: Stage, attn: nn.Module, cache: dict[str, Tensor], reads: list[str]) -> Operands:
    """attn.scores[h, t, k] = q[t, head h] . k[k, head h] / sqrt(d_k) (or the model's own divisor): the
    terms q_i k_i (stage_operands gives none where the scores are soft-capped or biased by ALiBi)."""
    heads = stage.heads.shape[0]
    q = _heads(cache[reads[0]], heads)[:, stage.positions]  # (h, P, d_k)
    k = _heads(cache[reads[1]], heads)  # (h, T, d_k)
    terms = largest_terms(q[:, :, None, :], k[:, None, :, :])  # (h, P, T, ...)
    divisor = math.sqrt(attn.d_k) if attn.scale is None else 1 / attn.scale  # Gemma 2, GPT-Neo: their own
    return Operands("qk", reads, n=q.shape[-1], scale=divisor, **terms)


def z_operands(stage: Stage, cache: dict[str, Tensor], reads: list[str]) -> Operands:
    """attn.z[t, h d_k + i] = sum over the keys k of weights[h, t, k] v[k, head h, i]: the terms."""
    weights = cache[reads[0]][0].to(torch.float64)[:, stage.positions]  # (h, P, T)
    v = _heads(cache[reads[1]], weights.shape[0])  # (h, T, d_k)
    terms = largest_terms(weights.permute(1, 0, 2)[:, :, None, :], v.permute(0, 2, 1)[None])  # (P, h, d_k, .)
    return Operands("mix", reads, n=weights.shape[-1], **{k: t.flatten(1, 2) for k, t in terms.items()})


def result_operands(stage: Stage, attn: nn.Module, cache: dict[str, Tensor], reads: list[str],
                    columns: list[int] | None) -> Operands:
    """attn.result[t, h d_model + j] = z[t, head h] . Wo[j, head h's d_k columns]: the terms z_i Wo[j, i]
    of each covered feature (``columns``, None: all). No bias: bo is added once, to the heads' sum."""
    z = cache[reads[0]][0, stage.positions].to(torch.float64)  # (P, h, d_k)
    heads, d_k = z.shape[-2:]
    weight = attn.o.weight.detach().to(torch.float64)  # (d_model, h d_k)
    covered = torch.tensor(columns if columns is not None else range(heads * weight.shape[0]))
    head, j = covered // weight.shape[0], covered % weight.shape[0]
    rows = weight.view(weight.shape[0], heads, d_k)[j, head]  # (C, d_k): feature j's weights over head h
    terms = largest_terms(z[:, head], rows[None])  # (P, C, K)
    return Operands("head_dot", reads, weight="Wo", columns=columns, n=d_k, bias_values=None, **terms)


def _covered(stage: Stage) -> list[int] | None:
    """The features a page shows of ``stage`` (a vocabulary's largest), None when it shows them all."""
    F = stage.rows.shape[1]
    columns = shown_columns(stage, stage.rows, min(F, MAX_COLUMNS))
    return None if columns == list(range(F)) else columns


def _adds_up(o: Operands, values: Tensor) -> bool:
    """Whether a product's shown terms + rest (+ bias, / scale) give the stage's finite numbers: they do
    not where an intervention replaced the stage after its operands were computed (a zeroed head's z)."""
    total = (o.x * o.w).sum(-1) + o.rest
    total = total + o.bias_values if o.bias_values is not None else total
    total = total / o.scale if o.scale else total
    finite = values.isfinite()
    size = float(values[finite].abs().max()) if bool(finite.any()) else 0.0  # bfloat16 forwards round at 1e-2
    return bool(torch.allclose(total[finite], values[finite], rtol=2e-2, atol=2e-2 * size + 1e-6))


def stage_operands(stage: Stage, config: ModelConfig, modules: dict[str, nn.Module],
                   cache: dict[str, Tensor], reads: dict[str, list[str]]) -> Operands | None:
    """The record for ``stage``, or None where its numbers have no formula over other stages here.

    ``cache``: the forward's cached stages (batch of one), ``sources``' among them."""
    prefix = f"blocks.{stage.block}." if stage.block is not None else ""
    layout = LAYOUTS[config.norm_position]
    positions = stage.positions
    own = reads.get(stage.name, [])
    path, weight, bias, _ = DOT_STAGES.get(stage.kind, ("", "", "", None))
    linear = modules.get(prefix + path) if own and path else None
    if isinstance(linear, nn.Linear):
        columns = _covered(stage)
        terms = dot(cache[own[0]][0, positions].flatten(1), linear, columns)
        o = Operands("dot", own, weight=weight, bias=bias if linear.bias is not None else "",
                     columns=columns, n=linear.weight.shape[1], **terms)
        return o if _adds_up(o, stage.rows if columns is None else stage.rows[:, columns]) else None
    attn = modules.get(prefix + "attn")
    if stage.kind == "attn.scores" and (attn.softcap is not None or getattr(attn, "alibi", None) is not None):
        return None  # tanh(s / cap) cap, or s - m_h |i - j|: not the sum of q_i k_i over a divisor
    if stage.kind in ("attn.scores", "attn.z") and own:
        o = (scores_operands(stage, attn, cache, own) if stage.kind == "attn.scores"
             else z_operands(stage, cache, own))
        return o if _adds_up(o, stage.heads if stage.kind == "attn.scores" else stage.rows) else None
    if stage.kind == "attn.result" and own:
        columns = _covered(stage)
        o = result_operands(stage, modules[prefix + "attn"], cache, own, columns)
        return o if _adds_up(o, stage.rows if columns is None else stage.rows[:, columns]) else None
    sums = [s for s in layout.sums if s.name == stage.kind]
    if sums and stage.block is not None and config.residual == "add":  # other residuals scale x or F
        return Operands("sum", [prefix + n for n in (sums[0].x, *sums[0].branches)])
    if stage.kind == "attn.weights":
        return Operands("softmax", [prefix + "attn.scores"])
    if stage.kind == "ffn.act" and own:
        ffn = modules[prefix + "ffn"]
        kind = activation_kind(ffn.activation).ffn_kind  # act(hidden), or gate(hidden) * linear
        if not kind.gated:
            return Operands(kind.operands, own, function=ffn.activation)
        with torch.no_grad():
            gate = ffn.gate(cache[own[0]][0, positions].to(torch.float64))
        return Operands(kind.operands, [own[0], prefix + "ffn.linear"], function=ffn.gate_name, gate=gate)
    return None
