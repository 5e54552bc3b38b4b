"""The numbers of a trace: one input through the model, every stage in forward order.

``collect_trace`` runs the model once with every hook point cached (docs/concepts.md#tracer-stages) and
turns each stage into a ``Stage``: its shape, the vector at each selected position, and
per-position mean, variance (biased, over the features), std, min, max and L2 norm. Stages
that are LayerNorms also get the mu, var and denominator the norm used and the normalized
vector z_hat before gamma/beta; FFN stages the fraction of units at or below zero;
attention scores and weights the matrix per head. A norm's input is the stage the block's
table (``layouts.LAYOUTS``) names for it, cached in the same pass (the embedding norm's, which is
no stage, through a forward hook), so nothing of the model's wiring is re-implemented here.
The cache only observes: the model computes what it computes untraced. Everything is float64
from here on.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from ...device import model_device
from ...nn.config import ModelConfig
from ...nn.embedding import embedding_parts
from ...nn.hooks import select_names
from ...nn.layouts import LAYOUTS
from ...nn.norm_kinds import NORM_KINDS
from ...nn.norms import LayerNorm, NoNorm
from .explain import explain_all  # words about the numbers, kept apart from the numbers
from .operands import sources, stage_operands
from .record import STAT_NAMES, NormNumbers, Operands, Stage, TopK, Trace

NORM_STAGES = {norm for layout in LAYOUTS.values() for norm in layout.norms} | {"ln_f"}  # kind "norm"
# A norm module's numbers belong to the stage of the same name; the embedding norm feeds `embed`.
NORM_MODULE_STAGE = {"embed_ln": "embed"}
# A norm's own stages (its denominator, its vector before gamma and beta: nn/norms.py), which the norm's own
# numbers show beside its output
NORM_OWN_SUFFIXES = tuple(f".{stage}" for stage in LayerNorm.STAGES)
EMBED_PARTS = ("tok", "pos")  # the stages x0 is the sum of; the `embed` stage reports their norms and share
TOP_K = 10  # the model's most likely next tokens listed per shown position
LENS_K = 5  # the logit lens' tokens per stream stage


def norm_input_stages(config: ModelConfig) -> dict[str, str]:
    """Each norm stage -> the stage holding that norm's input, from the layouts table: the
    lean path fuses some norms into its kernels, but their inputs are stages either way."""
    layout = LAYOUTS[config.norm_position]
    inputs = {f"blocks.{i}.{ln}": f"blocks.{i}.{src}"
              for i in range(config.n_layers) for ln, src in layout.norm_inputs.items()}
    if config.final_norm:
        inputs["ln_f"] = f"blocks.{config.n_layers - 1}.{layout.output}"
    return inputs


def row_stats(rows: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    """Per-row mean, var (biased), std, min, max, L2 over the finite entries; and the count left out."""
    finite = torch.isfinite(rows)
    n = finite.sum(-1).clamp(min=1)
    x = torch.where(finite, rows, torch.zeros((), dtype=rows.dtype))
    mean = x.sum(-1) / n
    var = torch.where(finite, (rows - mean[:, None]) ** 2, torch.zeros((), dtype=rows.dtype)).sum(-1) / n
    stats = {
        "mean": mean,
        "var": var,
        "std": var.sqrt(),
        "min": torch.where(finite, rows, torch.full((), float("inf"), dtype=rows.dtype)).amin(-1),
        "max": torch.where(finite, rows, torch.full((), float("-inf"), dtype=rows.dtype)).amax(-1),
        "l2": x.pow(2).sum(-1).sqrt(),
    }
    return stats, (~finite).sum(-1)


def _rows(name: str, x: Tensor, positions: list[int]) -> tuple[Tensor, Tensor | None]:
    """A cached tensor (batch of one) as (P, F) rows at ``positions``, plus per-head maps for attention.

    (1, T, F) -> rows of F;  (1, h, T, d_k) -> heads side by side (h * d_k);
    (1, T, h, d_k | d_model) z and result -> heads side by side;
    (1, h, T, T) scores/weights -> each query's row over all heads (h * T), and (h, P, T);
    a scalar (the loss) -> one row of one value.
    """
    x = x.detach().to(torch.float64)
    if x.dim() == 0:
        return x.reshape(1, 1), None
    x = x[0]
    if x.dim() == 3 and name.rsplit(".", 1)[-1] in ("z", "result"):  # (T, h, features): positions first
        return x.flatten(1)[positions], None
    if x.dim() == 3 and name.rsplit(".", 1)[-1] in ("scores", "weights"):  # (h, T, T)
        heads = x[:, positions, :]
        return heads.permute(1, 0, 2).reshape(len(positions), -1), heads
    if x.dim() == 3:  # (h, T, d_k)
        return x.permute(1, 0, 2).flatten(1)[positions], None
    return x[positions], None


def norm_numbers(module: nn.Module, x: Tensor, positions: list[int]) -> NormNumbers:
    """mu, var, denominator and z_hat of a LayerNorm for its input ``x`` (1, T, d), its input there,
    gamma and beta, in float64."""
    rows = x.detach()[0, positions].to(torch.float64)
    s = module.stats(rows)
    z = s.z_hat
    gamma, beta = (t.detach().double() if t is not None else None for t in (module.gamma, module.bias))
    return NormNumbers(
        variant=module.variant, eps=module.eps, input_l2=rows.norm(dim=-1),
        mu=s.mu[:, 0], var=s.var[:, 0], denom=s.denom[:, 0], z_hat=z,
        z_hat_mean=z.mean(-1), z_hat_var=z.var(-1, unbiased=False),
        expected_var=(s.var / s.denom**2)[:, 0], x=rows, gamma=gamma, beta=beta,
    )


def _kind(name: str) -> str:
    """What a stage is, from the last part of its name: ``blocks.0.attn.q`` -> ``attn.q``."""
    parts = name.split(".")
    last = ".".join(parts[-2:]) if len(parts) >= 2 and parts[-2] in ("attn", "ffn") else parts[-1]
    return "norm" if last in NORM_STAGES else last


def _capture_embed_norm_input(model: nn.Module) -> tuple[dict[str, Tensor], list]:
    """A forward hook recording the embedding norm's input (the summed embeddings, which are no
    stage of their own) by module path; removed by the caller."""
    inputs: dict[str, Tensor] = {}
    handles = []
    for path, module in model.named_modules():
        if path in NORM_MODULE_STAGE:

            def record(mod: nn.Module, args: tuple, out: Tensor, path: str = path) -> None:
                inputs[path] = args[0].detach()

            handles.append(module.register_forward_hook(record))
    return inputs, handles


def _norm_label(module: nn.Module | None) -> str:
    """The norm by its kind (LayerNorm, RMSNorm, BatchNorm); "" where no norm runs (an identity)."""
    if module is None or isinstance(module, (nn.Identity, NoNorm)):
        return ""
    kind = getattr(module, "kind", None)
    return type(module).__name__ if kind is None else kind.label


def stream_stages(model: nn.Module) -> list[str]:
    """The residual stream between blocks: x0 (``embed``), then each block's output stage."""
    return ["embed", *(f"blocks.{i}.{block.layout.output}" for i, block in enumerate(model.blocks))]


def top_k(stage: str, position: int, logits: Tensor, k: int, vocab: Sequence[str] | None,
          target: int | None = None) -> TopK:
    """The ``k`` most likely tokens of one logit vector (V,), with the target's rank when given."""
    logits = logits.to(torch.float64)
    probs = torch.softmax(logits, -1)
    values, ids = probs.topk(min(k, probs.numel()))
    found = TopK(stage, position, ids.tolist(), [vocab[i] if vocab else str(i) for i in ids.tolist()],
                 values.tolist(), logits[ids].tolist())
    if target is not None:
        found.target_rank = 1 + int((logits > logits[target]).sum())
        found.target_prob = float(probs[target])
    return found


def _predictions(model: nn.Module, cache: dict[str, Tensor], positions: list[int],
                 vocab: Sequence[str] | None, target: int | None) -> tuple[list[TopK], list[TopK]]:
    """The model's top k at each shown position, and the logit lens at the last one: each stream stage
    through the final norm and the head, as if the blocks after it were not there."""
    last = positions[-1]
    aim = target if target is not None and last == len(cache["logits"][0]) - 1 else None
    predictions = [top_k("logits", p, cache["logits"][0, p], TOP_K, vocab,
                         aim if p == last else None) for p in positions]
    lens = []
    with torch.no_grad():
        for name in stream_stages(model):
            x = cache[name][:, last:last + 1]  # (1, 1, d)
            logits = model.head(model.ln_f(x))[0, 0]
            lens.append(top_k(name, last, logits, LENS_K, vocab, aim))
    return predictions, lens


def collect_trace(
    model: nn.Module,
    ids: Sequence[int],
    tokens: Sequence[str] | None = None,
    *,
    position: int | None = None,
    target: int | None = None,
    target_token: str | None = None,
    vocab: Sequence[str] | None = None,
    names: str | Sequence[str] | None = None,
    source: str = "",
    text: str | None = None,
) -> Trace:
    """Run ``ids`` through ``model`` (eval, no grad) and describe every stage.

    ``position``: show only that position (negative counts from the end); default all.
    ``target``: a token id the last position should predict (adds the ``loss`` stage).
    ``vocab``: token strings of the whole vocabulary, to label logits and probabilities.
    ``names``: a glob or list of globs selecting the stages (default every stage).
    """
    ids = list(ids)
    T = len(ids)
    if T == 0:
        raise ValueError("the input has no tokens")
    tokens = list(tokens) if tokens is not None else [str(i) for i in ids]
    if position is not None and not -T <= position < T:
        raise ValueError(
            f"--position {position} is outside the input's {T} positions (0..{T - 1}, or -1 for the last)")
    positions = list(range(T)) if position is None else [position % T]
    config: ModelConfig = model.config
    # a norm's scale is shown with the norm (its denominator), not as a stage of its own
    shown = select_names([n for n in model.hook_names() if not n.endswith(NORM_OWN_SUFFIXES)], names, config)
    reads = sources(model, shown)  # what the hover's formulas read (operands.py)
    cache, embed_inputs, model = _run(model, ids, target, _needed(model, shown, reads))
    with torch.autocast("cpu", enabled=False):  # the numbers are read in float32/64, not the forward's dtype
        input_of = norm_input_stages(config)
        norm_inputs = {**{n: cache[src] for n, src in input_of.items() if n in shown}, **embed_inputs}
        reading = _Reading(cache, dict(model.named_modules()), norm_inputs,
                           {NORM_MODULE_STAGE.get(path, path): path for path in norm_inputs}, reads, vocab)
        trace = Trace(source=source, config=config, ids=ids, tokens=tokens, positions=positions, text=text)
        if target is not None:
            trace.target = {"position": T - 1, "id": int(target), "token": target_token or str(target)}
        trace.stages = [_stage(name, value, [T - 1] if _kind(name) == "loss" else positions, config, reading)
                        for name, value in cache.items() if name in shown]
        trace.predictions, trace.lens = _predictions(model, cache, positions, vocab, target)
        explain_all(trace, model)
    return trace


def _needed(model: nn.Module, shown: list[str], reads: dict) -> list[str]:
    """The stages to cache: those shown, the inputs of the norms shown, the embed stage's parts, the
    logits and the stream (predictions, logit lens) and what the hover's formulas read."""
    input_of = norm_input_stages(model.config)
    needed = shown + [input_of[n] for n in shown if n in input_of and input_of[n] not in shown]
    # the embed stage's parts are read even when only `embed` is asked for
    needed += [p for p in EMBED_PARTS if "embed" in shown and p not in needed and p in model.hook_names()]
    needed += [n for n in ("logits", *stream_stages(model)) if n not in needed]
    read = dict.fromkeys(n for names in reads.values() for n in names)
    return needed + [n for n in read if n not in needed]


def _run(model: nn.Module, ids: list[int], target: int | None, needed: list[str]
         ) -> tuple[Mapping[str, Tensor], dict[str, Tensor], nn.Module]:
    """The forward (eval, no grad, where the model is, in the caller's autocast): the cache of ``needed``,
    the embedding norm's inputs by module path, and the model to read parameters from (a CPU copy when
    it ran elsewhere: the numbers are read on the CPU)."""
    device = model_device(model)
    tokens_t = torch.tensor([ids], device=device)
    targets = None
    if target is not None:
        targets = torch.full_like(tokens_t, -100)
        targets[0, -1] = target
    was_training = model.training
    model.eval()
    embed_inputs, handles = _capture_embed_norm_input(model)
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens_t, names=needed, targets=targets)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if device.type != "cpu":
        cache = {name: value.cpu() for name, value in cache.items()}
        embed_inputs = {path: value.cpu() for path, value in embed_inputs.items()}
        model = copy.deepcopy(model).cpu()
    return cache, embed_inputs, model


@dataclass(frozen=True)
class _Reading:
    """What every stage is read against: the cache, the modules by path, each norm's input by module
    path, the norm module behind each norm stage, what the hover's formulas read, the vocabulary."""

    cache: Mapping[str, Tensor]  # the ActivationCache (a dict of CPU copies when the model ran elsewhere)
    modules: dict[str, nn.Module]
    norm_inputs: dict[str, Tensor]
    norm_for_stage: dict[str, str]
    reads: dict
    vocab: Sequence[str] | None


def _stage(name: str, value: Tensor, positions: list[int], config: ModelConfig, r: _Reading) -> Stage:
    """One stage's numbers at ``positions``: its rows and statistics, and what its kind adds (a norm's
    statistics, the FFN's fraction at or below zero, the embedding's parts, the hover's operands)."""
    kind = _kind(name)
    rows, heads = _rows(name, value, positions)
    stats, masked = row_stats(rows)
    parts = name.split(".")
    stage = Stage(
        name=name, kind=kind, block=int(parts[1]) if parts[0] == "blocks" else None,
        shape=tuple(value.shape), positions=positions, rows=rows, stats=stats, heads=heads,
        masked=masked if bool(masked.any()) else None,
        columns=list(r.vocab) if r.vocab is not None and kind in ("uncapped", "logits", "probs") else None,
    )
    module_path = r.norm_for_stage.get(name)
    if kind == "norm" or module_path is not None:
        module = r.modules.get(module_path or name)
        stage.norm_module = _norm_label(module)
        if isinstance(module, LayerNorm) and module_path in r.norm_inputs:
            stage.norm = norm_numbers(module, r.norm_inputs[module_path], positions)
    if kind in ("ffn.hidden", "ffn.act"):
        stage.frac_le_zero = (rows <= 0).to(torch.float64).mean(-1)
    if name == "embed" and "tok" in r.cache:
        pos = r.cache["pos"][0, positions] if "pos" in r.cache else None
        stage.parts = embedding_parts(r.cache["tok"][0, positions], pos)
    stage.operands = stage_operands(stage, config, r.modules, r.cache, r.reads)
    return stage


# ---- JSON (schema: blocklab/inspect/trace/schema.json) -----------------------------------------------

TRACE_FORMAT = "blocklab-trace"
TRACE_VERSION = 1


def json_numbers(t: Tensor) -> list:
    """A tensor as nested lists of floats; non-finite entries (masked scores) become null."""
    if t.dim() == 0:
        value = float(t)
        return value if math.isfinite(value) else None  # type: ignore[return-value]
    if t.dim() > 1:
        return [json_numbers(row) for row in t]
    return [v if math.isfinite(v) else None for v in t.tolist()]


def stage_to_dict(stage: Stage) -> dict:
    """One stage record: name, shape, per-position statistics, vectors and the kind's extras."""
    record = {
        "name": stage.name, "kind": stage.kind, "block": stage.block, "shape": list(stage.shape),
        "positions": stage.positions, "explanation": stage.explanation,
        **{k: json_numbers(stage.stats[k]) for k in STAT_NAMES},
        "values": json_numbers(stage.rows),
    }
    if stage.columns is not None:
        record["columns"] = stage.columns
    if stage.norm_module:
        record["norm_module"] = stage.norm_module
    if stage.norm is not None:
        n = stage.norm
        record["norm"] = {
            "variant": n.variant, "eps": n.eps,
            **{k: json_numbers(getattr(n, k)) for k in
               ("mu", "var", "denom", "z_hat_mean", "z_hat_var", "expected_var", "input_l2", "z_hat")},
            **norm_operands(n),
        }
    if stage.frac_le_zero is not None:
        record["frac_le_zero"] = json_numbers(stage.frac_le_zero)
    if stage.heads is not None:
        record["heads"] = json_numbers(stage.heads)
    if stage.parts is not None:
        record["parts"] = {k: json_numbers(getattr(stage.parts, k))
                           for k in ("tok_l2", "pos_l2", "tok_share")}
    if stage.masked is not None:
        record["masked"] = [int(v) for v in stage.masked]
    if stage.operands is not None:
        record["operands"] = operands_to_dict(stage.operands)
    return record


def norm_operands(n: NormNumbers) -> dict:
    """What a norm's number is computed from, beside mu and the denominator: its input x, gamma and beta
    (null where the norm has none), and z_hat's formula in words (``(x - mu) / sqrt(var+eps)``)."""
    kind = NORM_KINDS[n.variant]
    denominator = kind.denominator if kind.eps_inside_root else f"({kind.denominator})"
    return {"x": json_numbers(n.x), "formula": ("(x - mu) / " if kind.centres else "x / ") + denominator,
            "gamma": json_numbers(n.gamma) if n.gamma is not None else None,
            "beta": json_numbers(n.beta) if n.beta is not None else None}


def operands_to_dict(o: Operands) -> dict:
    """A stage's ``Operands`` as JSON: kind and reads, and the fields its kind has."""
    record: dict = {"kind": o.kind, "reads": o.reads}
    if o.function:
        record["function"] = o.function
    if o.gate is not None:
        record["gate"] = json_numbers(o.gate)
    if o.kind in ("dot", "qk", "mix", "head_dot"):
        record.update(n=o.n, index=o.index.tolist(), x=json_numbers(o.x), w=json_numbers(o.w),
                      rest=json_numbers(o.rest))
    if o.kind in ("dot", "head_dot"):
        record.update(weight=o.weight, bias=o.bias, columns=o.columns,
                      bias_values=json_numbers(o.bias_values) if o.bias_values is not None else None)
    if o.kind == "qk":
        record["scale"] = o.scale
    return record


def trace_to_dict(trace: Trace) -> dict:
    """The whole trace as JSON-ready data (format ``blocklab-trace``, version ``TRACE_VERSION``)."""
    return {
        "format": TRACE_FORMAT, "version": TRACE_VERSION, "source": trace.source, "notes": trace.notes,
        "config": trace.config.to_dict(),
        "input": {"text": trace.text, "ids": trace.ids, "tokens": trace.tokens},
        "positions": trace.positions, "target": trace.target,
        "stages": [stage_to_dict(s) for s in trace.stages],
        "predictions": [asdict(p) for p in trace.predictions],
        "lens": [asdict(p) for p in trace.lens],
    }
