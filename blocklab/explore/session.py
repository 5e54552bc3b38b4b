"""The models an explore server serves, and every computation the page asks of them.

Each model is an ``Explored``: its name, the ``Subject`` (model, tokenizer, source line) that ``blocklab
trace`` would build from the same flags, and a lock: a request holds its model's lock for the whole
computation, because hooks are attached to the model itself (two requests at once would see each
other's ablations). A ``Request`` is one parsed, checked API body.

Everything goes through the library's own calls, so the numbers are the Python API's:

    trace       inspect.trace.subject.trace_subject -> trace_to_dict, walk_to_dict (trace --json, --walk)
    ablations   model.hooks({stage: fn}) around the forward (a head: attn.z[..., h, :] = 0; a neuron:
                ffn.act[..., j] = 0; a sublayer: its output {attn,ffn}.out = 0)
    predict     softmax(nn.generate.sampling_logits(logits)) at the last position: the distribution
                nn.generate samples from, by its code (a tiny temperature: the argmax with p 1)
    gradients   model.run_with_cache(..., backward=True) with the target's loss, and
                inspect.diagnostics.path_tensors for the identity and branch paths of every connection
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..inspect.diagnostics import path_tensors
from ..inspect.nonfinite import NonFiniteError, refuse_nonfinite_output
from ..inspect.trace.collect import trace_to_dict
from ..inspect.trace.record import PER_HEAD_KINDS
from ..inspect.trace.subject import Subject, input_ids, target_id, trace_subject
from ..inspect.trace.walk import walk_to_dict
from ..nn.attention import HEADS_FIRST
from ..nn.config import ModelConfig
from ..nn.generate import GenerationConfig, next_token, sampling_logits
from ..nn.layouts import LAYOUTS, Norm, Sublayer, Sum
from ..nn.norm_kinds import NORM_KINDS
from ..nn.norms import LayerNorm
from ..nn.residual_kinds import RESIDUAL_KINDS

MAX_TOKENS = 256  # the longest input a request may trace (also capped by the model's max_seq_len)
MAX_TEXT = 4096  # characters of input text
MAX_ABLATIONS = 64
MAX_STAGES = 64  # globs in one request
BARS = 20  # next-token bars returned at most (top-k may keep more; their mass is reported)
ABLATION_KINDS = ("head", "neuron", "sublayer")
ABLATION_MODES = ("zero", "patch")


class RequestError(ValueError):
    """A request the server refuses: ``status`` is the HTTP status (400 unless said)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Explored:
    """One served model: its name in the page, what it is, and the lock its requests take."""

    name: str
    subject: Subject
    example: str = ""  # the input the page starts with
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def max_tokens(self) -> int:
        return min(MAX_TOKENS, self.subject.model.config.max_seq_len)

    def describe(self) -> dict[str, Any]:
        """What the page needs to draw the model and its controls (``/api/models``)."""
        c = self.subject.model.config
        return {
            "name": self.name, "source": self.subject.source, "config": c.to_dict(), "example": self.example,
            "notes": self.subject.notes, "next_token": self.subject.next_token,
            "layout": layout_to_dict(c), "tokenizer": self.subject.tokenizer is not None,
            "max_tokens": self.max_tokens, "block_stages": [n.split(".", 2)[2] for n in
                                                            self.subject.model.hook_names()
                                                            if n.startswith("blocks.0.")],
            "stages": self.subject.model.hook_names(),
            "norm_own_stages": list(LayerNorm.STAGES),  # a norm's inner stages: its numbers show them
            "per_head_kinds": list(PER_HEAD_KINDS),  # stages whose features are heads side by side
        }


def layout_to_dict(config: ModelConfig) -> dict[str, Any]:
    """The model's block as JSON, as the diagram draws it: its layout's steps in forward order, with its
    residual kind (no residual: a sum does not read the stream; its node's symbol) and its norm kind (no
    norm: no norm steps, whatever read one reads what the norm read), its title and formula."""
    layout, residual = LAYOUTS[config.norm_position], RESIDUAL_KINDS[config.residual]
    drawn_norms = NORM_KINDS[config.norm].normalises
    through = {s.name: s.reads for s in layout.steps if isinstance(s, Norm) and not drawn_norms}  # skipped

    def read(name: str) -> str:  # a stage as drawn: a skipped norm is what it reads
        return read(through[name]) if name in through else name

    steps = []
    for step in layout.steps:
        if isinstance(step, Norm) and drawn_norms:
            steps.append({"type": "norm", "name": step.name, "reads": [read(step.reads)], "out": step.name})
        elif isinstance(step, Sublayer):
            steps.append({"type": "sublayer", "name": step.name, "reads": [read(step.reads)],
                          "out": step.out})
        elif isinstance(step, Sum):
            x, branches = read(step.x), [read(b) for b in step.branches]
            steps.append({"type": "sum", "name": step.name, "out": step.name, "x": x, "branches": branches,
                          "reads": [x, *branches] if residual.identity_path else branches,
                          "residual": step.residual, "symbol": residual.node})
    connections = {kind: {"x": read(c.x), "branch": read(c.branch), "out": c.out, "residual": c.residual}
                   for kind, c in layout.connections.items()}
    return {"name": layout.name, "title": config.block_title, "formula": config.block_formula, "steps": steps,
            "output": read(layout.output), "final_norm": layout.final_norm, "connections": connections,
            "identity_path": residual.identity_path}


@dataclass(frozen=True)
class Ablation:
    """Zero one part of block ``block`` (``mode`` "zero"), or patch it with its value on another input
    (``mode`` "patch": the request's ``patch_from``, run through the plain model): a ``head`` (index: the
    head), an FFN ``neuron`` (index: the hidden unit) or a ``sublayer`` (name: attn or ffn)."""

    kind: str
    block: int
    index: int = 0
    name: str = ""
    mode: str = "zero"

    @property
    def stage(self) -> str:
        """The hook point the ablation replaces."""
        inner = {"head": "attn.z", "neuron": "ffn.act", "sublayer": f"{self.name}.out"}[self.kind]
        return f"blocks.{self.block}.{inner}"

    def hook(self, source: Tensor | None = None) -> Callable[[Tensor, Any], Tensor]:
        """The intervention: the stage's value with this part set to zero, or to ``source``'s (the stage on
        the patch input, same shape); a copy, the input is untouched."""
        kind, index = self.kind, self.index

        def replace(x: Tensor, _: Any) -> Tensor:
            x = x.clone()
            new = source if source is not None else torch.zeros_like(x)
            if kind == "head":
                x[:, :, index, :] = new[:, :, index, :]  # (B, T, h, d_k)
            elif kind == "neuron":
                x[..., index] = new[..., index]  # (B, T, d_ff)
            else:
                x[:] = new
            return x

        return replace


def parse_ablation(item: Any, entry: Explored) -> Ablation:
    """An ablation from the request's JSON, checked against the model's sizes."""
    if not isinstance(item, dict):
        raise RequestError("an ablation is an object like {'kind': 'head', 'block': 0, 'index': 1}, "
                           f"not {item!r}")
    kind = item.get("kind")
    if kind not in ABLATION_KINDS:
        raise RequestError(f"ablation kind {kind!r} is not one of: {', '.join(ABLATION_KINDS)}")
    c = entry.subject.model.config
    block, index, name = item.get("block"), item.get("index", 0), item.get("name", "")
    if not _is_int(block) or not 0 <= block < c.n_layers:
        raise RequestError(f"ablation block {block!r} is not a block of the model (0..{c.n_layers - 1})")
    mode = item.get("mode", "zero")
    if mode not in ABLATION_MODES:
        raise RequestError(f"ablation mode {mode!r} is not one of: {', '.join(ABLATION_MODES)}")
    if kind == "sublayer":
        if name not in ("attn", "ffn"):
            raise RequestError(f"a sublayer ablation names attn or ffn, not {name!r}")
        return Ablation(kind, block, 0, name, mode)
    size = c.n_heads if kind == "head" else c.d_ff
    if not _is_int(index) or not 0 <= index < size:
        raise RequestError(f"ablation {kind} {index!r} is out of range (0..{size - 1})")
    return Ablation(kind, block, index, "", mode)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class Request:
    """One API body, checked: the model, the input (text or ids), and what to do with it."""

    entry: Explored
    text: str | None = None
    tokens: str | None = None
    target: str | None = None
    position: int | None = None
    stages: list[str] | None = None
    ablate: list[Ablation] = field(default_factory=list)
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0
    sample: bool = False
    patch_from: str | None = None  # the patch input, in the form of the input (text, or ids "1,2,3")

    @classmethod
    def parse(cls, body: Any, models: dict[str, Explored]) -> Request:
        """A request from a decoded JSON body; RequestError (404 for an unknown model) naming the problem."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        name = body.get("model")
        if not isinstance(name, str):
            raise RequestError(f"model {name!r:.60} must be the name of a served model, as text "
                               f"({', '.join(models)})")
        if name not in models:
            raise RequestError(f"unknown model {name!r}; this server serves: {', '.join(models)}", 404)
        entry = models[name]
        text, tokens = body.get("input"), body.get("tokens")
        if text is not None and not isinstance(text, str):
            raise RequestError("input must be text")
        if isinstance(tokens, list) and all(_is_int(i) for i in tokens):
            tokens = ",".join(map(str, tokens))
        if tokens is not None and not isinstance(tokens, str):
            raise RequestError("tokens must be a list of ids or text like '1,2,3'")
        if len(text or "") > MAX_TEXT or len(tokens or "") > MAX_TEXT:
            raise RequestError(f"the input is longer than {MAX_TEXT} characters", 413)
        stages = body.get("stages")
        if stages is not None and (not isinstance(stages, list) or len(stages) > MAX_STAGES
                                   or not all(isinstance(s, str) for s in stages)):
            raise RequestError(f"stages must be a list of at most {MAX_STAGES} names or globs")
        ablate = body.get("ablate") or []
        if not isinstance(ablate, list) or len(ablate) > MAX_ABLATIONS:
            raise RequestError(f"ablate must be a list of at most {MAX_ABLATIONS} ablations")
        temperature, top_k = body.get("temperature", 1.0), body.get("top_k")
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not (
                math.isfinite(temperature) and 0 < temperature <= 100):
            raise RequestError(f"temperature {temperature!r} must be a number in (0, 100]")
        if top_k is not None and (not _is_int(top_k) or top_k < 1):
            raise RequestError(f"top_k {top_k!r} must be an integer >= 1 (or null: every token)")
        position, target, seed = body.get("position"), body.get("target"), body.get("seed", 0)
        if position is not None and not _is_int(position):
            raise RequestError(f"position {position!r} must be an integer")
        if target is not None and not isinstance(target, str):
            raise RequestError("target must be a token, as text")
        if not _is_int(seed) or not 0 <= seed < 2**63:
            raise RequestError(f"seed {seed!r} must be an integer >= 0")
        sample = body.get("sample", False)
        if not isinstance(sample, bool):
            raise RequestError(f"sample {sample!r:.60} must be true or false")
        patch_from = body.get("patch_from")
        if patch_from is not None and (not isinstance(patch_from, str) or len(patch_from) > MAX_TEXT):
            raise RequestError(f"patch_from must be an input of at most {MAX_TEXT} characters")
        request = cls(entry, text, tokens, target or None, position, stages,
                      [parse_ablation(a, entry) for a in ablate], float(temperature), top_k, seed,
                      sample, patch_from or None)
        request.ids()  # the input is checked now: a bad one is the client's mistake
        request.patch_ids()
        return request

    def patch_ids(self) -> list[int] | None:
        """The patch input's ids (None without a patch ablation): as long as the input, so positions align."""
        if not any(a.mode == "patch" for a in self.ablate):
            return None
        if self.patch_from is None:
            raise RequestError("a patch ablation needs patch_from: the input whose values are patched in")
        try:
            as_text = self.text is not None
            ids = input_ids(self.entry.subject, self.patch_from if as_text else None,
                            None if as_text else self.patch_from)
        except ValueError as error:
            message = f"patch_from: {error}".replace("--input", "input").replace("--tokens", "tokens")
            raise RequestError(message) from None
        if len(ids) != len(self.ids()):
            raise RequestError(f"patch_from has {len(ids)} tokens and the input {len(self.ids())}: a patch "
                               "takes each position's value from the same position of an input as long")
        return ids

    def ids(self) -> list[int]:
        """The input's ids (``blocklab trace``'s rules), at most the model's cap."""
        try:
            ids = input_ids(self.entry.subject, self.text, self.tokens)
        except ValueError as error:
            raise RequestError(str(error).replace("--input", "input").replace("--tokens", "tokens")) from None
        if not ids:
            raise RequestError("the input has no tokens")
        if len(ids) > self.entry.max_tokens:
            raise RequestError(f"the input has {len(ids)} tokens; this model takes at most "
                               f"{self.entry.max_tokens}", 413)
        return ids

    @contextmanager
    def ablated(self) -> Iterator[None]:
        """The model with this request's ablations attached (nothing attached without any)."""
        fns: dict[str, list] = {}
        source: dict[str, Tensor] = {}
        patch = self.patch_ids()
        if patch is not None:  # the patched stages on the patch input, through the plain model
            stages = sorted({a.stage for a in self.ablate if a.mode == "patch"})
            with torch.no_grad():
                _, source = self.entry.subject.model.run_with_cache(torch.tensor([patch]), names=stages)
        for ablation in self.ablate:
            fns.setdefault(ablation.stage, []).append(
                ablation.hook(source[ablation.stage] if ablation.mode == "patch" else None))
        plan = [(stage, fn) for stage, group in fns.items() for fn in group]
        with self.entry.subject.model.hooks(fwd_hooks=plan):
            yield


# ---- what the page asks -----------------------------------------------------------------------------


def trace(request: Request) -> dict[str, Any]:
    """The trace JSON of ``blocklab trace --json`` for the same input (with the ablations attached)."""
    with request.entry.lock, torch.no_grad(), request.ablated():
        try:
            found = trace_subject(request.entry.subject, request.text, request.tokens, request.target,
                                  request.position, request.stages)
        except NonFiniteError as error:  # the model overflows on this input: nothing to serve
            raise RequestError(str(error), 422) from None
        except ValueError as error:  # a glob matching no stage, a target outside the vocabulary
            raise RequestError(str(error)) from None
    return {**trace_to_dict(found), "walk": walk_to_dict(found)}  # the tutorial's derived steps, small inputs


def last_logits(request: Request, ablated: bool) -> Tensor:
    """The logits (V,) at the input's last position, float64; with or without the request's ablations."""
    model = request.entry.subject.model
    tokens = torch.tensor([request.ids()])
    with torch.no_grad(), request.ablated() if ablated else nullcontext():
        logits = model(tokens)
        try:  # an overflowing model (or ablation) serves no NaN: 422 naming where it began
            refuse_nonfinite_output(model, logits[0, -1], "logits", tokens)
        except NonFiniteError as error:
            raise RequestError(str(error), 422) from None
    return logits[0, -1].to(torch.float64)


def sampling(request: Request) -> GenerationConfig:
    """The request's temperature and top k as generation takes them (sampled: a T of 1 still samples)."""
    return GenerationConfig(do_sample=True, temperature=request.temperature, top_k=request.top_k)


def distribution(logits: Tensor, config: GenerationConfig) -> Tensor:
    """(V,) logits -> the (V,) next-token distribution generation samples from, by its own code."""
    return torch.softmax(sampling_logits(logits[None], config)[0], -1)


def bars(request: Request, logits: Tensor) -> dict[str, Any]:
    """The most likely next tokens under the request's temperature and top k (at most ``BARS``)."""
    probs = distribution(logits, sampling(request))
    shown = min(BARS, int((probs > 0).sum()), probs.numel())
    values, ids = probs.topk(shown)
    vocab = request.entry.subject.vocab()
    return {"ids": ids.tolist(), "tokens": [vocab[i] if vocab else str(i) for i in ids.tolist()],
            "probs": values.tolist(), "logits": logits[ids].tolist(), "kept": int((probs > 0).sum()),
            "shown_mass": float(values.sum())}


def predict(request: Request) -> dict[str, Any]:
    """The next-token bars of the plain model, and of the ablated one when ablations are given."""
    with request.entry.lock:
        result = {"temperature": request.temperature, "top_k": request.top_k,
                  "position": len(request.ids()) - 1, "plain": bars(request, last_logits(request, False))}
        if request.ablate:
            result["ablated"] = bars(request, last_logits(request, True))
    return result


def step(request: Request) -> dict[str, Any]:
    """One generation step: the most likely next token (``sample``: one seeded draw from the
    distribution), appended to the input; the new input in the form it was given (text or ids)."""
    with request.entry.lock:
        ids = request.ids()
        if len(ids) >= request.entry.max_tokens:
            raise RequestError(f"the input already has {len(ids)} tokens, the most this model takes", 413)
        logits, config = last_logits(request, True), sampling(request)
        probs = distribution(logits, config)
        if request.sample:
            generator = torch.Generator().manual_seed(request.seed)
            chosen = int(next_token(logits[None], config, None, generator)[0])
        else:  # greedy, as generate's: the largest logit
            chosen = int(logits.argmax())
    tok = request.entry.subject.tokenizer
    vocab = request.entry.subject.vocab()
    token = vocab[chosen] if vocab else str(chosen)
    if request.text is not None:
        exact = _decodes_back(tok, ids, request.text)  # else a word vocabulary: words apart
        new = tok.decode([*ids, chosen], skip_special_tokens=True) if exact else f"{request.text} {token}"
        return {"input": new, "id": chosen, "token": token, "prob": float(probs[chosen])}
    return {"tokens": ",".join(map(str, [*ids, chosen])), "id": chosen, "token": token,
            "prob": float(probs[chosen])}


def _decodes_back(tok: Any, ids: list[int], text: str) -> bool:
    """Whether decoding the ids gives the text back (byte-level BPE does; a word vocabulary may not)."""
    try:
        return tok.decode(ids, skip_special_tokens=True) == text
    except (ValueError, TypeError, KeyError):
        return False


def gradients(request: Request) -> dict[str, Any]:
    """d loss / d stage for the target at the last position: each stage's gradient L2 norm per position,
    and at every residual connection the identity and branch paths' norms (the diagnostics' split)."""
    if request.target is None:
        raise RequestError("gradients need a target: the token the last position should predict")
    subject = request.entry.subject
    model = subject.model
    with request.entry.lock:
        ids = request.ids()
        try:
            aim = target_id(subject.tokenizer, request.target, model.config.vocab_size)
        except ValueError as error:
            raise RequestError(str(error).replace("--target", "target")) from None
        tokens = torch.tensor([ids])
        targets = torch.full_like(tokens, -100)
        targets[0, -1] = aim
        was_training = model.training
        model.eval()
        try:
            with torch.enable_grad(), request.ablated():
                (_, loss), cache = model.run_with_cache(tokens, targets=targets, detach=False,
                                                        names="*")  # every stage, under blocklab's names
                if not bool(torch.isfinite(loss)):
                    raise RequestError(f"the loss is {float(loss)}: the model overflows on this input "
                                       "(the trace names the first non-finite stage)", 422)
                names = [n for n in cache if n != "loss" and cache[n].requires_grad]
                found = torch.autograd.grad(loss, [cache[n] for n in names], retain_graph=True,
                                            allow_unused=True)
                grads = {n: g if g is not None else torch.zeros_like(cache[n])
                         for n, g in zip(names, found, strict=True)}
                paths = [{kind: {k: _per_position("resid", t) for k, t in
                                 path_tensors(model, cache, grads, layer, kind).items()}
                          for kind in LAYOUTS[model.config.norm_position].connections}
                         for layer in range(model.config.n_layers)]
        finally:
            model.train(was_training)
    stages = {n: _per_position(n, g) for n, g in grads.items() if g.dim() >= 2}
    return {"loss": float(loss.detach()),
            "target": {"id": aim, "token": request.target, "position": len(ids) - 1},
            "stages": stages, "paths": paths}




def _per_position(name: str, g: Tensor) -> list[float]:
    """A stage's gradient as its L2 norm at each position: (1, T, ...), or (1, h, T, ...) for the attention
    stages that keep heads first -> (T,)."""
    g = g.detach().to(torch.float64)[0]
    if name.endswith(tuple(f".{stage}" for stage in HEADS_FIRST)) and g.dim() == 3:
        g = g.transpose(0, 1)
    return g.flatten(1).norm(dim=-1).tolist() if g.dim() >= 2 else g.abs().tolist()
