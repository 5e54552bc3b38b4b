"""One line of plain words per stage: what it did, with the numbers that show it.

Each stage kind has a function ``(stage, walk) -> str``; ``walk`` gives the model, its config
and the stages seen so far. The LayerNorm line states why z_hat's variance is var/(var+eps),
slightly under 1: it is the eps added under the square root. (It is not the d vs d-1 question:
var already divides by d, the same d the check uses.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ...nn.activation_kinds import ACTIVATION_KINDS
from ...nn.ffn_kinds import ROUTINGS
from ...nn.layouts import LAYOUTS
from ...nn.norm_kinds import NORM_KINDS
from ...nn.position_kinds import POSITION_KINDS
from ...nn.rotary import inverse_frequencies, rotary_dim
from .record import Stage, Trace

BRANCH_WORDS = {"attn": "attention", "ffn": "FFN"}
# what a norm is for, where its name alone does not say: the final norm, and a norm on a sublayer's
# output (sandwich), read from the layouts table
# (layout, norm) -> the words naming a norm's role where the name alone does not say it (the final norm,
# a norm on a sublayer's output: sandwich's and res_post's ln1_out are different layouts' norms)
NORM_ROLES = {(layout.name, "ln_f"): "final norm before the head: " for layout in LAYOUTS.values()} | {
    (layout.name, norm): f"{layout.title} norm of the {BRANCH_WORDS[source.split('.')[0]]} output: "
    for layout in LAYOUTS.values() for norm, source in layout.norm_inputs.items() if source.endswith(".out")
}


@dataclass
class Walk:
    """What an explanation may look at: the model, its config and the stages so far by name."""

    trace: Trace
    model: nn.Module
    seen: dict[str, Stage]
    modules: dict[str, nn.Module]

    def sibling(self, stage: Stage, short: str) -> Stage | None:
        """The stage ``short`` in the same block as ``stage`` (or at top level)."""
        prefix = f"blocks.{stage.block}." if stage.block is not None else ""
        return self.seen.get(prefix + short)

    def module(self, path: str) -> nn.Module | None:
        return self.modules.get(path)


def _n(x: float) -> str:
    """A number for prose: 4 significant digits."""
    return f"{x:.4g}"


def _l2(stage: Stage | None) -> float:
    return float(stage.stats["l2"].mean()) if stage is not None else float("nan")


def _near_one(values: list[float]) -> str:
    """Numbers just under 1, with enough decimals to show how far under: ``0.999952 to 0.999971``."""
    gap = min(abs(1 - x) for x in values)
    decimals = 4 if gap == 0 or gap >= 1e-3 else min(12, math.ceil(-math.log10(gap)) + 1)
    lo, hi = (f"{x:.{decimals}f}" for x in (min(values), max(values)))
    return lo if lo == hi else f"{lo} to {hi}"


def _change(before: float, after: float) -> str:
    """``grew from 5.651 to 5.664``, with as many digits as it takes to show the change."""
    for digits in range(4, 9):
        a, b = f"{before:#.{digits}g}", f"{after:#.{digits}g}"  # '#' keeps trailing zeros: 5.660
        if a != b:
            verb = "grew" if after > before else "shrank"
            return f"mean L2 norm per position {verb} from {a} to {b}"
    return f"mean L2 norm per position stayed at {_n(after)}"


TOKEN_FACTOR_WORDS = {
    "sqrt_d_model": "looked up each token's row of E and multiplied it by sqrt(d_model) = {f}",
    "none": "looked up each token's row of E (no factor)",
}



def _tok(s: Stage, w: Walk) -> str:
    c = w.trace.config
    words = TOKEN_FACTOR_WORDS[c.embed_scale].format(f=_n(math.sqrt(c.d_model)))
    return f"token part of x0: {words}; mean L2 norm per position {_n(_l2(s))}"


def _pos(s: Stage, w: Walk) -> str:
    c = w.trace.config
    words = POSITION_KINDS[c.pos_encoding].explains.format(n=_n(math.sqrt(c.d_model / 2)))
    return f"position part of x0: {words}; mean L2 norm per position {_n(_l2(s))}"


def _embed(s: Stage, w: Walk) -> str:
    c = w.trace.config
    parts = ["token part"]
    kind = POSITION_KINDS[c.pos_encoding]  # rotary and ALiBi act inside attention (rot_q, rot_k; scores)
    parts += [kind.part] if kind.adds_to_x0 else []
    if c.type_vocab_size:
        parts.append("token-type embedding")
    words = f"x0 = {' + '.join(parts)}"
    if s.norm_module:
        words += f", normalized with {s.norm_module}"
    share = ""
    if s.parts is not None and kind.adds_to_x0:
        mean_share = float(s.parts.tok_share.mean())
        share = f"; token share ||tok|| / (||tok|| + ||pos||) {mean_share:.1%} (mean over positions)"
    return f"embedding: {words}; mean L2 norm per position {_n(_l2(s))}{share}"


def _resid_pre(s: Stage, w: Walk) -> str:
    return f"block {s.block} input: the residual stream entering the block; mean L2 norm {_n(_l2(s))}"


def _qkv(s: Stage, w: Walk) -> str:
    attn = w.module(s.name.rsplit(".", 1)[0])
    letter = s.kind[-1]
    role = {"q": "queries", "k": "keys", "v": "values"}[letter]
    n = (attn.n_heads if letter == "q" else attn.n_kv_heads) if attn is not None else None
    heads = f"split into {n} heads of d_k {attn.d_k}" if attn is not None else "split into heads"
    if attn is not None and letter != "q" and attn.n_kv_heads != attn.n_heads:
        heads += f", each shared by {attn.n_heads // attn.n_kv_heads} query heads (grouped-query)"
    bias = f" + b{letter}" if attn is not None and attn.q.bias is not None else ""
    return f"{role}: the attention input times W{letter}^T{bias}, {heads} (columns hH:D, head H's feature D)"


PAIRS = {"half": "feature m with feature m + {half}", "interleaved": "features 2m and 2m + 1"}


def _rotary(s: Stage, w: Walk) -> str:
    """The rotation in numbers: which pairs, by which angle at the shown position(s)."""
    c, letter = w.trace.config, s.kind[-1]
    d_k = c.d_head
    dim = rotary_dim(d_k, c.rotary_fraction)
    base, scaling = c.rotary_of(s.block if s.block is not None else 0)  # a local layer's base may differ
    freqs = inverse_frequencies(dim, base, scaling).tolist()
    p = s.positions[-1]
    shown = sorted({0, min(1, len(freqs) - 1), len(freqs) - 1})  # the first pairs and the last
    angles = ", ".join(f"pair {m} by {_n(p * freqs[m])} rad" for m in shown)
    kept = f"; features {dim}..{d_k - 1} pass unchanged" if dim < d_k else ""
    scaled = "" if not scaling else " (Llama 3's scaling divides the low frequencies)" \
        if scaling["rope_type"] == "llama3" else f" (linear scaling: each divided by {scaling['factor']:g})"
    if c.local_rotary_base is not None:  # Gemma 3: the layers with a window have their own base
        kind = "local" if c.window(s.block or 0) is not None else "global"
        scaled += f" (a {kind} layer: local layers use local_rotary_base {_n(c.local_rotary_base)}, " \
                  f"global ones rotary_base {_n(c.rotary_base)})"
    before = w.sibling(s, f"attn.{letter}")
    norms = f"; lengths kept: mean L2 norm {_n(_l2(before))} -> {_n(_l2(s))}" if before is not None else ""
    pairs = PAIRS[c.rotary_style].format(half=dim // 2)
    return (f"rotary positions ({'queries' if letter == 'q' else 'keys'}): each head's first {dim} of {d_k} "
            f"features rotated in {dim // 2} pairs ({pairs}), pair m by "
            f"position x base^(-2m/{dim}), base {_n(base)}{scaled}; at {w.trace.label(p)}: "
            f"{angles}{kept}{norms}. So q . k depends on the positions only through their distance")


def _qk_norm(s: Stage, w: Walk) -> str:
    """QK-norm in numbers: over what, each head's length before and after, gamma's largest size."""
    letter = s.kind.split(".")[1][0]  # attn.q_norm -> q
    attn = w.module(s.name.rsplit(".", 1)[0])
    norm = getattr(attn, f"{letter}_norm")
    heads = s.rows.shape[1] // attn.d_k
    label = norm.kind.label
    over = (f"each head's d_k = {attn.d_k} features, one gamma of {attn.d_k} shared by the {heads} heads"
            if attn.qk_norm == "head" else f"all {heads} heads' {heads * attn.d_k} features at once")
    per_head = lambda st: float(st.rows.reshape(len(st.positions), heads, attn.d_k).norm(dim=-1).mean())
    before = w.sibling(s, f"attn.{letter}")
    lengths = f"{_n(per_head(before))} -> {_n(per_head(s))}" if before is not None else _n(per_head(s))
    gamma = float(norm.gamma.detach().abs().max())
    return (f"QK-norm ({'queries' if letter == 'q' else 'keys'}): {label} over {over}, before the rotation "
            f"and the scores; mean L2 norm per head {lengths} (sqrt(d_k) = {_n(math.sqrt(attn.d_k))} times "
            f"gamma, whose largest |value| is {_n(gamma)}), so the scores no longer grow with Wq and Wk")


def _scores(s: Stage, w: Walk) -> str:
    attn = w.module(s.name.rsplit(".", 1)[0])
    d_k = attn.d_k if attn is not None else s.shape[-1]
    alibi = getattr(attn, "alibi", None)
    bias = "" if alibi is None else (
        " - m_h |i - j| (ALiBi: a penalty per step between query i and key j, "
        f"slopes m_h {', '.join(_n(m) for m in alibi)} for heads 0..{len(alibi) - 1})")
    c = w.trace.config
    divisor, named = c.score_divisor if attn is not None else (math.sqrt(d_k), "sqrt(d_k)")
    cap = "" if c.attn_softcap is None else \
        f", soft-capped to {c.attn_softcap:g} tanh(s / {c.attn_softcap:g}) (Gemma 2)"
    text = (f"scores: q . k / {named} = / {_n(divisor)}{cap}{bias} for every head, query (row) and key; "
            f"range {_n(float(s.stats['min'].min()))} to {_n(float(s.stats['max'].max()))}")
    window = c.window(s.block) if s.block is not None else None
    if window is not None:
        text += f"; a local layer: each query sees the last {window} keys (its sliding window)"
    if s.masked is not None:
        text += f"; {int(s.masked.sum())} entries masked to -inf (keys a query may not see)"
    return text


def _weights(s: Stage, w: Walk) -> str:
    h, P, T = s.heads.shape
    flat = int(s.heads.argmax())
    head, q, k = flat // (P * T), (flat // T) % P, flat % T
    t = w.trace
    return (f"weights: softmax over the keys of each row of scores, so every row sums to 1; strongest "
            f"{_n(float(s.heads.max()))}: head {head}, {t.label(s.positions[q])} -> {t.label(k)} "
            f"(uniform would be {_n(1 / T)})")


def _head_norms(s: Stage, heads: int) -> list[float]:
    """Mean L2 norm of each head's block of columns (the rows are heads side by side)."""
    per_head = s.rows.unflatten(-1, (heads, -1))  # (P, h, features)
    return per_head.norm(dim=-1).mean(0).tolist()


def _z(s: Stage, w: Walk) -> str:
    norms = _head_norms(s, s.shape[-2])
    return (f"z: each head's weighted sum of the values (weights @ v), heads side by side (columns "
            f"hH:D), before Wo; mean L2 norm per head {', '.join(_n(v) for v in norms)}")


def _result(s: Stage, w: Walk) -> str:
    norms = _head_norms(s, s.shape[-2])
    top = max(range(len(norms)), key=norms.__getitem__)
    return (f"result: each head's z times its own columns of Wo, without bo: what each head adds to the "
            f"attention output (summed over the heads, plus bo, they are attn.out); the largest is head "
            f"{top}, mean L2 norm {_n(norms[top])}")


def _attn_out(s: Stage, w: Walk) -> str:
    return (f"attention output: each head's weighted sum of values, heads concatenated and projected by Wo; "
            f"mean L2 norm {_n(_l2(s))}")


def _residual(s: Stage, w: Walk) -> str:
    block = w.module(f"blocks.{s.block}")
    # every connection adding into this sum: one, or attention and the FFN side by side (parallel)
    layout = LAYOUTS[w.trace.config.norm_position]
    into = [c for c in layout.connections.values() if c.out == s.kind]
    res = getattr(block, into[0].residual, None)
    x_name, f_name = into[0].x, " + ".join(c.branch for c in into)
    x, branch = w.sibling(s, x_name), " and ".join(BRANCH_WORDS[c.sublayer] for c in into)
    # with --stages the stream before may not have been collected: then only the norm after
    change = _change(_l2(x), _l2(s)) if x is not None else f"mean L2 norm per position {_n(_l2(s))}"
    change += "".join(f"; the {BRANCH_WORDS[c.sublayer]} read the {BRANCH_WORDS[reads.split('.')[0]]} output"
                      for c in into  # the simplified block's FFN reads the attention output
                      if (reads := layout.sublayer(c.sublayer).reads).endswith(".out"))
    kind = getattr(res, "kind", "add")
    if kind == "rezero":
        a = _n(float(res.scale.detach()))
        return (f"residual (ReZero): x + a * the {branch} output with learned a = {a} "
                f"(0 at init: the block starts as the identity); {change}")
    if kind == "deepnorm":
        return (f"residual (DeepNorm): alpha * x + the {branch} output, "
                f"alpha = (2N)^(1/4) = {_n(res.alpha)}; {change}")
    if kind == "none":
        return f"no residual: the stream is replaced by the {branch} output, nothing of x is kept; {change}"
    outputs = "outputs" if len(into) > 1 else "output"
    return f"residual: added the {branch} {outputs} ({f_name}) back to the stream ({x_name}); {change}"


def _norm(s: Stage, w: Walk) -> str:
    where = NORM_ROLES.get((w.trace.config.norm_position, s.name.rsplit(".", 1)[-1]), "")
    n, kind = s.norm, NORM_KINDS[w.trace.config.norm]
    if n is None:
        if not s.norm_module and not kind.normalises:
            return f"{where}{kind.explains}"
        if not s.norm_module:
            layout = LAYOUTS[w.trace.config.norm_position]
            why = (f"final_norm=False: the {layout.title} blocks already end in a norm"
                   if layout.norm_on_stream else "final_norm=False")
            return f"{where}no norm here ({why}): the values pass through unchanged"
        if s.norm_module == kind.label:  # a kind without per-position numbers (BatchNorm)
            return f"{where}{kind.label}: {kind.explains}"
        return f"{where}{s.norm_module}: normalized; mean L2 norm {_n(_l2(s))}"
    kind = NORM_KINDS[n.variant]
    explained = kind.explains.format(span=_near_one(n.expected_var.tolist()), eps=f"{n.eps:g}")
    return f"{where}{kind.label}: {explained}"


def _ffn_module(s: Stage, w: Walk) -> nn.Module | None:
    return w.module(s.name.rsplit(".", 1)[0])


def _ffn_hidden(s: Stage, w: Walk) -> str:
    ffn = _ffn_module(s, w)
    kind = ACTIVATION_KINDS.get(getattr(ffn, "activation", ""))
    gate = kind.ffn_kind.hidden_words if kind is not None else ""
    pct = 100 * float(s.frac_le_zero.mean())
    return (f"FFN expand: d_model {ffn.d_model} -> d_ff {ffn.d_ff} with W1 (x W1^T + b1){gate}; "
            f"{pct:.1f}% of hidden units are <= 0")


def _ffn_linear(s: Stage, w: Walk) -> str:
    ffn = _ffn_module(s, w)
    return (f"FFN linear branch: d_model {ffn.d_model} -> d_ff {ffn.d_ff} with W3 (x W3^T + b3), no "
            f"activation; it multiplies the gate's output unit by unit; mean L2 norm {_n(_l2(s))}")


def _ffn_act(s: Stage, w: Walk) -> str:
    ffn = _ffn_module(s, w)
    kind = ACTIVATION_KINDS.get(getattr(ffn, "activation", ""))
    words = kind.explains if kind is not None else "activation"
    return f"{words}; {100 * float(s.frac_le_zero.mean()):.1f}% of units now <= 0"


def _ffn_out(s: Stage, w: Walk) -> str:
    ffn = _ffn_module(s, w)
    if getattr(ffn, "n_experts", 0):
        shared = " plus the shared expert times its sigmoid gate" if ffn.shared is not None else ""
        return (f"mixture out: each token's {ffn.top_k} experts' outputs (d_ff {ffn.d_ff} -> d_model "
                f"{ffn.d_model} each) times their weights, summed{shared}; mean L2 norm {_n(_l2(s))}")
    return f"FFN contract: d_ff {ffn.d_ff} -> d_model {ffn.d_model} with W2; mean L2 norm {_n(_l2(s))}"


def _router_logits(s: Stage, w: Walk) -> str:
    ffn = _ffn_module(s, w)
    return (f"router: one logit per expert, x Wr^T (d_model {ffn.d_model} -> {ffn.n_experts} experts); "
            f"{ROUTINGS[ffn.router_softmax].label} picks each token's {ffn.top_k}")


def _expert_indices(s: Stage, w: Walk) -> str:
    ffn = _ffn_module(s, w)
    return f"the {ffn.top_k} experts each token goes to, of {ffn.n_experts}, highest router logit first"


def _expert_weights(s: Stage, w: Walk) -> str:
    """Which experts each shown position went to, with which weights."""
    ffn = _ffn_module(s, w)
    indices = w.sibling(s, "ffn.expert_indices")
    routes = "; ".join(
        f"{w.trace.label(p)} -> " + ", ".join(f"expert {int(e)} ({_n(float(v))})" for e, v in zip(ie, iv,
                                                                                               strict=True))
        for p, ie, iv in zip(s.positions, indices.rows, s.rows, strict=True)) if indices is not None else ""
    routing = ROUTINGS[ffn.router_softmax]
    renormalised = "" if routing.renormalises else ", renormalised to sum 1" if ffn.renormalize else \
        ", not renormalised"
    return f"expert weights ({routing.label}{renormalised}): {routes}"


def _top(s: Stage, w: Walk) -> tuple[str, str, float]:
    """(position label, top token, its value) at the last shown position."""
    row = s.rows[-1]
    i = int(row.argmax())
    token = s.columns[i] if s.columns else str(i)
    return w.trace.label(s.positions[-1]), repr(token), float(row[i])


def _logits(s: Stage, w: Walk) -> str:
    tied = " (tied to the embedding)" if w.trace.config.tie_embeddings else ""
    where, token, value = _top(s, w)
    cap = w.trace.config.logit_softcap
    how = f"the final stream times the vocabulary matrix{tied}" if cap is None else \
        f"head.uncapped soft-capped, {_n(cap)} * tanh(x / {_n(cap)}), inside +-{_n(cap)}"
    return (f"logits: {how}, {s.rows.shape[1]} scores per position; at {where} the top one is {token} "
            f"({_n(value)})")


def _uncapped(s: Stage, w: Walk) -> str:
    tied = " (tied to the embedding)" if w.trace.config.tie_embeddings else ""
    where, token, value = _top(s, w)
    return (f"logits before the soft-cap: the final stream times the vocabulary matrix{tied}; at {where} "
            f"the top one is {token} ({_n(value)})")


def _probs(s: Stage, w: Walk) -> str:
    where, token, p = _top(s, w)
    return (f"probabilities: softmax of the logits over the vocabulary; at {where} the model predicts "
            f"{token} with p = {_n(p)} (uniform would be {_n(1 / s.rows.shape[1])})")


def _loss(s: Stage, w: Walk) -> str:
    t = w.trace.target or {}
    V = w.trace.config.vocab_size
    ranked = [p for p in w.trace.predictions if p.target_rank is not None]
    rank = f"; the target ranks {ranked[0].target_rank} of {V}" if ranked else ""
    return (f"loss: cross-entropy -ln p(target {t.get('token')!r}) at {w.trace.label(s.positions[0])} = "
            f"{_n(float(s.rows[0, 0]))} (a uniform guess gives ln {V} = {_n(math.log(V))}){rank}")


EXPLAINERS: dict[str, Callable[[Stage, Walk], str]] = {
    "tok": _tok, "pos": _pos, "embed": _embed, "resid_pre": _resid_pre,
    "attn.q": _qkv, "attn.k": _qkv, "attn.v": _qkv, "attn.rot_q": _rotary, "attn.rot_k": _rotary,
    "attn.q_norm": _qk_norm, "attn.k_norm": _qk_norm,
    "attn.scores": _scores, "attn.weights": _weights,
    "attn.z": _z, "attn.result": _result,
    "attn.out": _attn_out, "resid_mid": _residual, "resid_post": _residual, "norm": _norm,
    "ffn.hidden": _ffn_hidden, "ffn.linear": _ffn_linear, "ffn.act": _ffn_act, "ffn.out": _ffn_out,
    "ffn.router_logits": _router_logits, "ffn.expert_indices": _expert_indices,
    "ffn.expert_weights": _expert_weights,
    "uncapped": _uncapped, "logits": _logits, "probs": _probs, "loss": _loss,
}


def explain_all(trace: Trace, model: nn.Module) -> None:
    """Fill in every stage's ``explanation``, in order."""
    walk = Walk(trace, model, {}, dict(model.named_modules()))
    for stage in trace.stages:
        explainer = EXPLAINERS.get(stage.kind)
        words = explainer(stage, walk) if explainer else f"{stage.name}: mean L2 norm {_n(_l2(stage))}"
        stage.explanation = words
        walk.seen[stage.name] = stage
