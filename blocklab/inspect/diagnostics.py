"""Gradient flow and forward statistics of a Transformer, read through its hook points.

Gradient flow (docs/concepts.md#residual-connection). A residual connection computes
``out = combine(x, F(x))`` (``x + F(x)`` for ``add``). With g = dL/dout its backward splits into two terms:

    dL/dx = J_combine,x^T g  +  J_F(x)^T (dL/dF)      identity path + branch path
          = g                +  J_F(x)^T g            for combine = add

Both terms are computed with autograd on the tensors the hook points expose (the branch
term as ``autograd.grad(F(x), x, dL/dF)``, the identity term through the block's own
``Residual`` module), so they sum to the total dL/dx by construction of the chain rule,
not by subtraction. Nothing of the model is re-implemented here.

The input: the token and position parts of x0 (the ``tok`` and ``pos`` stages), their mean L2
norms and the token share ``embedding.TOKEN_SHARE``, averaged over the (valid) positions.

Forward statistics per layer: the residual stream's per-position L2 norm and variance,
the LayerNorm inputs' mean and variance (``norms.layer_norm_stats``), the fraction of FFN
pre-activations <= 0 and of "dead" hidden units (<= 0 at every position of the batch),
and each head's attention entropy. Padded positions (``attention_mask == 0``) are left out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..nn.config import ModelConfig
from ..nn.embedding import embedding_parts
from ..nn.layouts import LAYOUTS
from ..nn.memory import check_memory
from ..nn.model import Transformer
from ..nn.moe import expert_token_counts, expert_tokens
from ..nn.norm_kinds import NORM_KINDS
from ..nn.norms import layer_norm_stats
from ..tasks import Task


@dataclass
class PathGradient:
    """Norms of dL/dx at one residual connection: the total and its two paths."""

    total: float
    identity: float
    branch: float


@dataclass
class LayerDiagnostics:
    """Everything measured for block ``layer``; x_l is the block's residual-stream input."""

    layer: int
    grad_resid: float  # ||dL/dx_l||
    grad_params: dict[str, float]  # parameter group -> gradient norm
    residual: dict[str, PathGradient]  # "attn" / "ffn" connection -> its path norms
    resid_norm: float  # mean over positions of ||x_l||_2
    resid_var: float  # variance of x_l's entries
    norm_inputs: dict[str, dict[str, float]]  # each norm of the layout -> {"mu": mean mu, "var": mean var}
    ffn_frac_le0: float  # fraction of FFN pre-activations <= 0
    ffn_dead: float  # fraction of hidden units <= 0 at every position
    attn_entropy: list[float]  # per head, nats, mean over query positions
    # a mixture of experts: the (token, choice) pairs each expert was given (the FFN fractions above are
    # over every expert's hidden units, each on its own tokens); [] for a dense FFN
    expert_tokens: list[int] = field(default_factory=list)


@dataclass
class Diagnostics:
    """A stack's gradient flow and forward statistics on one batch."""

    loss: float
    layers: list[LayerDiagnostics]
    grad_resid_out: float  # ||dL/dx_N||, the gradient entering the stack from above
    resid_norm_out: float
    # x0's parts, means over positions: tok_l2 (||tok||), pos_l2 (||pos||), tok_share (TOKEN_SHARE)
    embedding: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested dict."""
        return asdict(self)

    def profile(self, key: str) -> list[float]:
        """One scalar per layer: ``grad_resid``, ``resid_norm``, ``grad_params.ffn.w2``, ``ffn_dead``..."""
        if key.startswith("grad_params."):
            group = key.removeprefix("grad_params.")
            return [layer.grad_params.get(group, float("nan")) for layer in self.layers]
        return [getattr(layer, key) for layer in self.layers]

    @property
    def norms(self) -> list[str]:
        """The norms whose inputs were measured (the layout's, in forward order; none with norm='none')."""
        return list(self.layers[0].norm_inputs) if self.layers else []

    def summary(self) -> dict[str, Any]:
        """A compact per-layer profile for a metrics.jsonl line (lists indexed by layer)."""
        out: dict[str, Any] = {
            "loss": self.loss,
            "grad_resid": self.profile("grad_resid") + [self.grad_resid_out],
            "resid_norm": self.profile("resid_norm") + [self.resid_norm_out],
            "ffn_frac_le0": self.profile("ffn_frac_le0"),
            "ffn_dead": self.profile("ffn_dead"),
            "attn_entropy": [sum(h) / len(h) for h in self.profile("attn_entropy")],
            **{f"embed_{k}": v for k, v in self.embedding.items()},
        }
        for group in ("attn", "ffn.w1", "ffn.w2", *self.norms):
            if group in self.layers[0].grad_params:
                out[f"grad_{group}"] = self.profile(f"grad_params.{group}")
        for ln in self.norms:
            out[f"{ln}_in_var"] = [layer.norm_inputs[ln]["var"] for layer in self.layers]
            out[f"{ln}_in_mu"] = [layer.norm_inputs[ln]["mu"] for layer in self.layers]
        for kind in self.layers[0].residual:  # the sublayers with a residual connection of their own
            out[f"{kind}_identity"] = [layer.residual[kind].identity for layer in self.layers]
            out[f"{kind}_branch"] = [layer.residual[kind].branch for layer in self.layers]
        return out


def _param_group(name: str) -> str:
    """``attn.q.weight`` -> ``attn``; ``ffn.w1.bias`` -> ``ffn.w1``; ``res1.scale`` -> ``residual``."""
    parts = name.split(".")
    if parts[0] == "ffn":
        return f"ffn.{parts[1]}"
    return "residual" if parts[0] in ("res1", "res2") else parts[0]


def _norm(t: Tensor | None) -> float:
    return 0.0 if t is None else float(t.detach().double().norm())


def _group_norms(grads: dict[str, Tensor]) -> dict[str, float]:
    squares: dict[str, float] = {}
    for name, g in grads.items():
        group = _param_group(name)
        squares[group] = squares.get(group, 0.0) + _norm(g) ** 2
    return {group: math.sqrt(s) for group, s in squares.items()}


def _stage_names(model: Transformer) -> list[str]:
    """The hook points diagnostics read: residual stream, branches, norms, FFN hidden, attention weights."""
    layout = LAYOUTS[model.config.norm_position]
    c = model.config
    ffn = [f"ffn.experts.{e}.hidden" for e in range(c.n_experts)] + ["ffn.expert_indices"] if c.n_experts \
        else ["ffn.hidden"]
    wanted = {"resid_pre", *ffn, "attn.weights", *layout.norms}
    wanted |= {stage for c in layout.connections.values() for stage in (c.x, c.branch, c.out, *c.others)}
    wanted |= set(layout.norm_inputs.values())
    parts = [name for name in ("tok", "pos") if name in model.hook_names()]
    return parts + [f"blocks.{i}.{s}" for i in range(len(model.blocks)) for s in sorted(wanted)]


def _embedding_stats(cache: dict[str, Tensor], valid: Tensor) -> dict[str, float]:
    """Mean ||tok||, ||pos|| and token share over the valid positions (``embedding.embedding_parts``)."""
    pos = cache["pos"][valid] if "pos" in cache else None
    parts = embedding_parts(cache["tok"][valid], pos)  # (N_valid,) each
    return {"tok_l2": float(parts.tok_l2.mean()), "pos_l2": float(parts.pos_l2.mean()),
            "tok_share": float(parts.tok_share.mean())}


def _valid_positions(tokens: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(B, T) bool: True at real (non-padding) positions."""
    if attention_mask is None:
        return torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
    return attention_mask.bool()


def _forward_stats(
    model: Transformer, cache: dict[str, Tensor], valid: Tensor
) -> list[dict[str, Any]]:
    """Per layer: residual-stream, LayerNorm-input, FFN and attention statistics (valid positions only)."""
    c = model.config
    rows = []
    for i in range(c.n_layers):
        at = lambda stage: cache[f"blocks.{i}.{stage}"].detach()
        x = at("resid_pre")[valid].double()  # (N_valid, d)
        norm_inputs = {}
        if NORM_KINDS[c.norm].normalises:
            # what the norm computes per position (RMSNorm: mu 0, var = mean(z^2)); for BatchNorm,
            # whose statistics span the batch, the input's own per-position mean and variance
            for ln, stage in LAYOUTS[c.norm_position].norm_inputs.items():
                stats = layer_norm_stats(at(stage)[valid].double(), c.eps, c.norm)
                norm_inputs[ln] = {"mu": float(stats.mu.mean()), "var": float(stats.var.mean())}
        hidden, counts = _ffn_hidden(c.n_experts, at, valid)
        weights = at("attn.weights").double()  # (B, h, T, T); masked keys have weight 0
        entropy = torch.special.entr(weights).sum(-1)  # (B, h, T)
        per_head = entropy.permute(0, 2, 1)[valid].mean(0)  # (h,)
        rows.append({
            "resid_norm": float(x.norm(dim=-1).mean()),
            "resid_var": float(x.var(unbiased=False)),
            "norm_inputs": norm_inputs,
            "ffn_frac_le0": sum(int((h <= 0).sum()) for h in hidden) / max(sum(h.numel() for h in hidden), 1),
            "ffn_dead": float(torch.stack([(h <= 0).all(dim=0).double().mean() for h in hidden]).mean()),
            "attn_entropy": [float(h) for h in per_head],
            "expert_tokens": counts,
        })
    return rows


def _ffn_hidden(n_experts: int, at: Any, valid: Tensor) -> tuple[list[Tensor], list[int]]:
    """The FFN's hidden pre-activations on the valid positions: [(N_valid, d_ff)] for a dense FFN; for a
    mixture each expert's on the valid tokens it was given, and how many (token, choice) pairs each got."""
    if not n_experts:
        return [at("ffn.hidden")[valid]], []
    indices = at("ffn.expert_indices")  # (B, T, k)
    chosen, keep = indices.reshape(-1, indices.shape[-1]), valid.reshape(-1)  # (N, k), (N,)
    hidden = []
    for e in range(n_experts):  # the expert's rows are its tokens in expert_tokens' order
        token = expert_tokens(chosen, e)[0]
        hidden.append(at(f"ffn.experts.{e}.hidden")[keep[token]])  # (N_valid_e, d_ff)
    return hidden, expert_token_counts(indices, n_experts, valid).tolist()


def path_tensors(
    model: Transformer, cache: dict[str, Tensor], grads: dict[str, Tensor], layer: int, kind: str
) -> dict[str, Tensor]:
    """dL/dx at one residual connection (``kind`` "attn" or "ffn"): ``total``, ``identity``, ``branch``.

    ``cache`` holds the forward's tensors (not detached) and ``grads`` dL/d(stage) for them. Where
    one sum adds both sublayers to the same x (the parallel block), each sublayer's ``branch`` is
    its own path and the identity and both branches sum to the total.
    """
    connection = LAYOUTS[model.config.norm_position].connections[kind]
    x_stage, f_stage, out_stage = connection.x, connection.branch, connection.out
    name = lambda stage: f"blocks.{layer}.{stage}"
    x, f = cache[name(x_stage)], cache[name(f_stage)]
    # branch path: J_F(x)^T (dL/dF), through the sublayer's own graph
    (branch,) = torch.autograd.grad(f, x, grads[name(f_stage)], retain_graph=True)
    # identity path: the block's own residual combine, differentiated in its first argument
    combine = getattr(model.blocks[layer], connection.residual)
    x0 = x.detach().requires_grad_(True)
    added = sum((cache[name(other)].detach() for other in connection.others), f.detach())
    combined = combine(x0, added)
    if combined.requires_grad:
        (identity,) = torch.autograd.grad(combined, x0, grads[name(out_stage)])
    else:  # residual "none": out = F(x), no identity path
        identity = torch.zeros_like(x)
    return {"total": grads[name(x_stage)], "identity": identity, "branch": branch}


def diagnose(
    model: Transformer, tokens: Tensor, targets: Tensor, attention_mask: Tensor | None = None
) -> Diagnostics:
    """Gradient flow and forward statistics of ``model`` on one batch.

    Runs one extra forward and backward with ``torch.autograd.grad``: parameters' ``.grad``,
    the global RNG and buffers (BatchNorm running statistics) are left as they were.
    """
    return _diagnose(model, tokens, targets, attention_mask)[0]


def diagnose_paths(
    model: Transformer, tokens: Tensor, targets: Tensor, attention_mask: Tensor | None = None
) -> list[dict[str, dict[str, Tensor]]]:
    """The tensors behind every ``PathGradient``: per layer, {"attn"/"ffn": path_tensors(...)}."""
    return _diagnose(model, tokens, targets, attention_mask, keep_tensors=True)[1]


def _diagnose(
    model: Transformer, tokens: Tensor, targets: Tensor, attention_mask: Tensor | None,
    keep_tensors: bool = False,
) -> tuple[Diagnostics, list[dict[str, dict[str, Tensor]]]]:
    c = model.config
    # the buffers a training-mode forward changes (BatchNorm's running statistics) are put back after;
    # the fixed tables (sinusoidal positions, rotary frequencies: non-persistent) are not copied, a long
    # sinusoidal table would otherwise double the run's memory (issue 35, F13)
    persistent = set(model.state_dict(keep_vars=True))
    buffers = {name: b.clone() for name, b in model.named_buffers() if name in persistent}
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        (_, loss), cache = model.run_with_cache(
            tokens, targets=targets, attention_mask=attention_mask, names=_stage_names(model), detach=False
        )
        # (a mixture's expert indices are integers: no gradient)
        stages = [name for name in cache if name.startswith("blocks.") and cache[name].requires_grad]
        params = {n: p for n, p in model.named_parameters() if n.startswith("blocks.") and p.requires_grad}
        wrt = [cache[n] for n in stages] + list(params.values())
        all_grads = torch.autograd.grad(loss, wrt, retain_graph=True, allow_unused=True)
        grads = dict(zip(stages, all_grads[: len(stages)], strict=True))
        param_grads = dict(zip(params, all_grads[len(stages):], strict=True))
        stats = _forward_stats(model, cache, _valid_positions(tokens, attention_mask))
        layers, kept = [], []
        for i in range(c.n_layers):
            prefix = f"blocks.{i}."
            mine = {n.removeprefix(prefix): g for n, g in param_grads.items() if n.startswith(prefix)}
            paths = {kind: path_tensors(model, cache, grads, i, kind)  # the simplified block: ffn's alone
                     for kind in LAYOUTS[c.norm_position].connections}
            residual = {kind: PathGradient(**{k: _norm(t) for k, t in p.items()})
                        for kind, p in paths.items()}
            layers.append(LayerDiagnostics(
                layer=i, grad_resid=_norm(grads[f"{prefix}resid_pre"]), grad_params=_group_norms(mine),
                residual=residual, **stats[i],
            ))
            if keep_tensors:
                kept.append({kind: {k: t.detach() for k, t in p.items()} for kind, p in paths.items()})
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in buffers:
                b.copy_(buffers[name])
    last = f"blocks.{c.n_layers - 1}.{LAYOUTS[c.norm_position].output}"
    valid = _valid_positions(tokens, attention_mask)
    diagnostics = Diagnostics(
        loss=float(loss.detach()), layers=layers, grad_resid_out=_norm(grads[last]),
        resid_norm_out=float(cache[last].detach()[valid].double().norm(dim=-1).mean()),
        embedding=_embedding_stats(cache, valid),
    )
    return diagnostics, kept


# ---- at initialization, and during training ------------------------------------------------------


def diagnose_at_init(config: ModelConfig, task: Task, batch_size: int = 64, seed: int = 0) -> Diagnostics:
    """``diagnose`` a freshly initialized ``Transformer(config)`` (seeded) on the first training examples."""
    check_memory(config, batch_size, task.seq_len, what=f"diagnosing {task.name}", force_flag=False)
    torch.manual_seed(seed)
    model = Transformer(config)
    data = task.split("train")
    mask = None if data.attention_mask is None else data.attention_mask[:batch_size]
    return diagnose(model, data.inputs[:batch_size], data.targets[:batch_size], mask)


class DiagnosticsLogger:
    """Training callback: every ``every`` steps, ``diagnose`` the step's batch; the compact per-layer
    profile (``Diagnostics.summary``) goes into that step's metrics.jsonl line under ``"diag"``."""

    def __init__(self, every: int) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"--log-diagnostics={every!r} must be an integer >= 1 (every K steps)")
        self.every = every

    def __call__(self, ctx: Any) -> dict[str, Any] | None:  # ctx: train.StepContext
        if ctx.step % self.every and ctx.step != 1:
            return None
        return {"diag": diagnose(ctx.model, ctx.inputs, ctx.targets, ctx.attention_mask).summary()}


def diagnostics_table(diag: Diagnostics, title: str = "") -> Any:
    """A rich Table: one row per layer (gradient flow, then forward statistics)."""
    from rich.table import Table

    table = Table(title=title or f"diagnostics (loss {diag.loss:.4f})")
    norms = diag.norms
    columns = ["layer", "|dL/dx|", "attn id", "attn br", "ffn id", "ffn br", "g attn", "g w1", "g w2",
               *(f"g {ln}" for ln in norms), "|x|", *(f"{ln.upper()} in var" for ln in norms), "ffn<=0",
               "dead", "attn H"]
    for col in columns:
        table.add_column(col, justify="right")
    fmt = lambda v: "-" if v is None else f"{v:.3g}"
    for row in diag.layers:
        table.add_row(
            str(row.layer), fmt(row.grad_resid),
            *(fmt(getattr(row.residual.get(k), p, None))  # simplified: no attention connection
              for k in ("attn", "ffn") for p in ("identity", "branch")),
            *(fmt(row.grad_params.get(g)) for g in ("attn", "ffn.w1", "ffn.w2", *norms)),
            fmt(row.resid_norm),
            *(fmt(row.norm_inputs[ln]["var"]) for ln in norms),
            f"{row.ffn_frac_le0:.1%}", f"{row.ffn_dead:.1%}",
            fmt(sum(row.attn_entropy) / len(row.attn_entropy)),
        )
    table.add_row("out", fmt(diag.grad_resid_out), *[""] * (7 + len(norms)), fmt(diag.resid_norm_out),
                  *[""] * (3 + len(norms)))
    e = diag.embedding
    if e:
        table.caption = (f"x0 = tok + pos: mean ||tok|| {fmt(e['tok_l2'])}, mean ||pos|| {fmt(e['pos_l2'])}, "
                         f"token share ||tok||/(||tok||+||pos||) {e['tok_share']:.1%} (mean over positions)")
    return table
