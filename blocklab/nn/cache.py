"""The activation cache (docs/tracer.md#the-activation-cache): every stage's tensor from one forward
pass, read by name, by layer, stacked over layers, or as the sum that makes the residual stream.

    out, cache = model.run_with_cache(tokens)
    cache["blocks.0.resid_post"]            a stage, as the forward computed it
    cache["resid_post", 0]                  the same: a block's stage by layer (-1: the last block)
    cache["blocks.0.hook_resid_post"]       TransformerLens's name (hook_names.TRANSFORMERLENS_ALIASES)
    cache.decompose_resid()                 the embedding and every sublayer output: they sum to the stream
    cache.logit_attrs(stack, tokens)        each part's share of a token's logit
    cache.hidden_states                     transformers' output_hidden_states=True list

The residual stream is a sum only where no norm sits on it. Pre-norm, sandwich and the parallel
blocks add each sublayer's output to the stream (the parallel ones both to the same x), so the
stream entering any block (and leaving the last) is the embedding plus every earlier attention
and FFN output (``residual="rezero"`` and ``"deepnorm"`` scale the parts: the decomposition carries
the scales). Post-norm blocks normalise the stream
itself (resid_mid -> LN1, resid_post -> LN2): within a block ``resid_mid = resid_pre + attn.out``
and ``resid_post = ln1 + ffn.out`` are sums, but a stream that went through LN1 or LN2 is not a
sum of what came before it, so a decomposition reaching one is refused (or, with
``stop_at_norm=True``, ends there: the norm's output is one part). With norm="none" the norms
are the identity and the stream is a sum again.

Gradients (``run_with_cache(..., backward=True)``) need every cached stage to be a tensor the
forward used, in the autograd graph: the stages are recorded by interventions, so the blocks run
their module path (and attention its explicit path when scores or weights are cached, and sums the
per-head results when they are). Forward values then agree with the plain run to float rounding
rather than bit for bit; ``cache.grads`` holds d(scalar)/d(stage), exactly what
``torch.autograd.grad`` gives for those tensors.

``HookedModule`` (nn/hooked.py, the mixin of TransformerBlock and Transformer) gives them
``run_with_cache``, which returns this cache. The decompositions live in nn/decompose.py, and
TransformerLens' finer ones (every neuron, the full decomposition) and its batch slice in nn/tl_cache.py
(mixins of ``ActivationCache``); this module holds the stages, their names and the run that records them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor, nn

from .hook_names import (
    blocklab_name,
    in_transformerlens_view,
    short_alias,
    transformerlens_names,
)
from .hooks import HookFn, NameFilter, hook_points, hooks, select_names
from .tl_cache import TransformerLensAnalysis

Key = str | tuple[str, int]
Backward = bool | Callable[[object], Tensor]
Derive = Callable[[Tensor], Tensor]


class Stages(Mapping[str, Tensor]):
    """The cached stages in forward order: the tensors kept, and the stages derived from one of them when
    first read (then kept). ``run_with_cache`` derives, rather than keeps, what TransformerLens does not
    cache and blocklab can recompute from what it keeps: each head's ``attn.result`` from ``attn.z`` (the
    attention's own computation, the same numbers), ``probs`` from ``logits`` (the same softmax), and a
    norm's output after gamma and beta from its ``normalized`` stage (equal to the forward's to float
    rounding). A derivation reads the model's weights when it runs."""

    def __init__(self, kept: Mapping[str, Tensor], derived: Mapping[str, tuple[str, Derive]] | None = None
                 ) -> None:
        self._kept = dict(kept)
        self._derived = {n: d for n, d in (derived or {}).items() if d[0] in self._kept}
        after: dict[str, list[str]] = {}
        for name, (source, _) in self._derived.items():
            after.setdefault(source, []).append(name)
        self._order = [m for n in self._kept for m in (n, *after.get(n, ()))]

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._kept and name in self._derived:
            source, derive = self._derived[name]
            with torch.no_grad():
                self._kept[name] = derive(self._kept[source])
        return self._kept[name]

    def __setitem__(self, name: str, value: Tensor) -> None:
        if name not in self:
            self._order.append(name)
        self._kept[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self._kept or name in self._derived

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def kept(self) -> dict[str, Tensor]:
        """The tensors held now (derived stages only once read)."""
        return dict(self._kept)

    def map(self, change: Callable[[Tensor], Tensor]) -> Stages:
        """Every kept tensor changed (sliced, moved, cast); derived stages derived again from the changed."""
        return Stages({n: change(t) for n, t in self._kept.items() if n not in self._derived}, self._derived)


class ActivationCache(TransformerLensAnalysis, Mapping[str, Tensor]):
    """Stage name -> tensor, in the order the forward pass reached the stages (a read-only Mapping).

    A key is a stage name (``blocks.0.attn.weights``), TransformerLens's name for it
    (``blocks.0.attn.hook_pattern``) or a hook point's module path; or ``(name, layer)``: a stage
    of block ``layer`` by its name within the block (``"attn.weights"``), by the last part of it
    when that is unique (``"weights"``), or by TransformerLens's short name (``"pattern"``).
    ``grads`` is a cache of d(scalar)/d(stage) when ``run_with_cache(..., backward=...)`` made one.

    Asked in TransformerLens' words (its hook name, or its short name with a layer: ``("v", 0)``), q, k,
    v and their normed and rotated forms come in TransformerLens' layout (B, T, h, d_head), a view of
    blocklab's (B, h, T, d_k), which blocklab's own names give (a mixture's expert indices: (B T, k) for
    (B, T, k); hook_names.TRANSFORMERLENS_LAYOUTS).

    The keys it iterates (``keys()``, ``items()``, ``list(cache)``) are spelled as the stages were asked
    for: blocklab's names, or with ``transformerlens_keys`` TransformerLens' names where it has one
    (``blocks.0.attn.hook_pattern``; a stage it has no name for keeps blocklab's), each with the tensor
    that name gives. Either spelling indexes it.
    """

    def __init__(self, stages: Mapping[str, Tensor], model: nn.Module,
                 grads: Mapping[str, Tensor] | None = None, transformerlens_keys: bool = False) -> None:
        self._stages = stages if isinstance(stages, Stages) else Stages(stages)
        self.model = model
        self.has_batch_dim = True  # False after remove_batch_dim (TransformerLens' has_batch_dim)
        self.transformerlens_keys = transformerlens_keys
        self._tl_keys: list[str] | None = None
        self.grads = ActivationCache(grads, model, None, transformerlens_keys) if grads is not None else None

    # -- the Mapping --------------------------------------------------------------------------------

    def __getitem__(self, key: Key) -> Tensor:
        if isinstance(key, str) and key in self._stages:
            return self._stages[key]
        name, spelled_tl = self._resolve(key)
        tensor = self._stages[name]
        return in_transformerlens_view(name, tensor) if spelled_tl else tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def _keys(self) -> list[str] | dict[str, Tensor]:
        """The keys it iterates: the stages' names, or their TransformerLens names (spelled once: the
        stages' names never change)."""
        if not self.transformerlens_keys:
            return self._stages
        if self._tl_keys is None:
            config = getattr(self.model, "config", None)
            self._tl_keys = []
            for key in _transformerlens_keys(self._stages, config):
                parts = key.split(".")  # a norm TransformerLens also names as its tied copy: both names
                self._tl_keys += [key] + [".".join([*parts[:2], copy, *parts[3:]])
                                          for copy, norm in self._copies(key).items() if parts[2] == norm]
        return self._tl_keys

    def __repr__(self) -> str:
        names = list(self)  # as it iterates them; a stage may have two TransformerLens names: counted once
        shown = ", ".join(names[:4]) + (f", ... ({len(self._stages)} stages)" if len(names) > 4 else "")
        return f"ActivationCache({shown}{', with grads' if self.grads is not None else ''})"

    def remove_batch_dim(self) -> ActivationCache:
        """Every stage without its batch dimension, in place (TransformerLens' ``remove_batch_dim``): for a
        cache of one input; a ValueError for a larger batch."""
        sizes = {t.shape[0] for t in self._stages.kept().values() if t.dim() > 0}
        if sizes != {1}:
            raise ValueError(f"remove_batch_dim needs a batch of 1; this cache's batch is {sorted(sizes)}")
        self._stages = self._stages.map(lambda t: t[0] if t.dim() > 0 else t)
        self.has_batch_dim = False
        if self.grads is not None:
            self.grads.remove_batch_dim()
        return self

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
           ) -> ActivationCache:
        """The same cache with every tensor (and gradient) moved to ``device`` / cast to ``dtype``."""
        move = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else None)
        grads = {n: move(g) for n, g in self.grads.items()} if self.grads is not None else None
        moved = ActivationCache(self._stages.map(move), self.model, grads, self.transformerlens_keys)
        moved.has_batch_dim = self.has_batch_dim
        return moved

    def with_transformerlens_keys(self, on: bool = True) -> ActivationCache:
        """The same stages (the same tensors, and gradients) iterated under TransformerLens' names (or, with
        ``on=False``, blocklab's)."""
        grads = dict(self.grads._stages) if self.grads is not None else None
        return ActivationCache(self._stages, self.model, grads, on)

    def name_of(self, key: Key) -> str:
        """The stage name ``key`` means (see the class docstring); a KeyError says why there is none."""
        return self._resolve(key)[0]

    def _resolve(self, key: Key) -> tuple[str, bool]:
        """(the stage ``key`` means, whether ``key`` is in TransformerLens' words); a KeyError says why
        there is no such stage."""
        if isinstance(key, tuple):
            if len(key) == 3 and isinstance(key[2], str) and isinstance(key[1], int):  # ("scale", 0, "ln1")
                return self._resolve(_layer_type_name(key[0], key[1] % self.n_layers, key[2]))
            if len(key) == 3 and key[2] is None:
                key = key[:2]
            if len(key) != 2 or not isinstance(key[0], str) or not isinstance(key[1], int):
                raise KeyError(f"a key is a stage name, (name, layer) or (name, layer, sublayer): {key!r}")
            return self._layer_stage(*key)
        try:
            name = blocklab_name(key, getattr(self.model, "config", None))
        except ValueError as error:
            raise KeyError(str(error)) from None
        if name not in self._stages and "hook_" in key:
            name = self._one_norm(name)
        if name not in self._stages:
            raise KeyError(self._missing(key, name))
        return name, "hook_" in key

    def _copies(self, name: str) -> dict[str, str]:
        """TransformerLens' names for the norms of the block stage ``name`` is in that are another norm's
        (``Layout.transformerlens_copies``: {"ln2": "ln1"} in GPT-J's and Phi's block); {} elsewhere."""
        parts, blocks = name.split("."), getattr(self.model, "blocks", None)
        if blocks is None or len(parts) < 4 or parts[0] != "blocks" or not parts[1].isdigit() \
                or int(parts[1]) >= len(blocks):
            return {}
        return dict(blocks[int(parts[1])].layout.transformerlens_copies)

    def _one_norm(self, name: str) -> str:
        """``blocks.0.ln2.scale`` -> ``blocks.0.ln1.scale`` where TransformerLens' ln2 is a copy of the
        block's one norm (GPT-J, Phi); any other name unchanged."""
        parts, copies = name.split("."), self._copies(name)
        return ".".join([*parts[:2], copies[parts[2]], *parts[3:]]) if copies.get(parts[2]) else name

    def _layer_stage(self, written: str, layer: int) -> tuple[str, bool]:
        n = self.n_layers
        if not -n <= layer < n:
            raise KeyError(f"layer {layer} is outside the model's {n} blocks (0..{n - 1}, or negative from "
                           "the end)")
        prefix = f"blocks.{layer % n}."
        config = getattr(self.model, "config", None)
        name = blocklab_name(written, config)
        spelled_tl = "hook_" in written
        try:
            short_stage = short_alias(name, config)
        except ValueError as error:
            raise KeyError(str(error)) from None
        for candidate, short in ((name, spelled_tl), (short_stage, True)):
            if candidate is not None and prefix + candidate in self._stages:
                return prefix + candidate, short
        ending = [s for s in self._stages if s.startswith(prefix) and s.endswith("." + name)]
        if len(ending) == 1:
            return ending[0], spelled_tl
        if len(ending) > 1:
            raise KeyError(f"{name!r} in block {layer} is ambiguous: {', '.join(ending)}")
        raise KeyError(self._missing(name, prefix + name))

    def _missing(self, key: str, name: str) -> str:
        """Why ``name`` (what ``key`` means) is not in the cache: never a stage, or not cached."""
        names = getattr(self.model, "hook_names", None)  # a block or model lists its stages
        known = names() if callable(names) else list(self._stages)
        if name in known:
            return f"stage {name!r} was not cached (run_with_cache(names=...) chose others)"
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = (f"did you mean {', '.join(close)}?" if close else
                f"stages look like {', '.join(known[:6])}, ...")
        said = repr(key) if key == name else f"{key!r} ({name!r})"
        return f"no stage {said}; {hint}"

    # -- stages over layers -------------------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        """How many blocks the model has."""
        return len(self._blocks("a layer index"))

    def stack_activation(self, name: str, layer: int | None = None, sublayer_type: str | None = None
                         ) -> Tensor:
        """Stage ``name`` (as in ``cache[name, layer]``, or ``cache[name, layer, sublayer_type]``) of
        blocks 0 .. layer - 1 (default: all), stacked: (layers, *the stage's shape)."""
        last = self.n_layers if layer is None or layer == -1 else layer
        return torch.stack([self[name, i, sublayer_type] for i in range(last)])

    @property
    def hidden_states(self) -> list[Tensor]:
        """What ``transformers`` returns with ``output_hidden_states=True``: x0 (``embed``), the
        output of every block but the last, and the final hidden state (``ln_f``: the last block's
        output after the final norm, or as it is where there is none). n_layers + 1 tensors (B, T, d)."""
        blocks = self._blocks("hidden_states")
        outputs = [self[f"blocks.{i}.{block.layout.output}"] for i, block in enumerate(blocks[:-1])]
        return [self["embed"], *outputs, self["ln_f"]]


# TransformerLens' short sublayer names in cache[name, layer, sublayer] (its utils.get_act_name)
_SUBLAYERS = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}


def _layer_type_name(name: str, layer: int, sublayer: str) -> str:
    """TransformerLens' hook name for ``cache[name, layer, sublayer]``: ("scale", 0, "ln1") ->
    ``blocks.0.ln1.hook_scale``, ("pattern", 0, "a") -> ``blocks.0.attn.hook_pattern``."""
    sublayer = _SUBLAYERS.get(sublayer, sublayer)
    return f"blocks.{layer}.{sublayer + '.' if sublayer else ''}hook_{name}"


def _transformerlens_keys(stages: Mapping[str, Tensor], config: object | None) -> list[str]:
    """The stages' keys under TransformerLens' names, in the stages' order: every name TransformerLens'
    model of this kind has for a stage (``ln_f`` is ``ln_final.hook_normalized`` and ``unembed.hook_in``),
    blocklab's where it has none."""
    keys: list[str] = []
    for name in stages:
        keys += transformerlens_names(name, config) or [name]
    return keys


# ---- running with a cache --------------------------------------------------------------------------


def run_with_cache(
    root: nn.Module, *args: object, names: NameFilter = None, detach: bool = True, backward: Backward = False,
    **kwargs: object,
) -> tuple[object, ActivationCache]:
    """Run ``root(*args, **kwargs)`` and return (its output, an ActivationCache of the stages).

    Names are relative to ``root``; the cache is in the order the stages ran. The cache observes
    (``detach=True``): the output is what ``root`` computes unobserved, bit for bit.
    ``detach=False`` keeps each stage in the autograd graph, as the tensor the forward used: the
    blocks then run module by module (forward values unchanged; gradients agree to rounding).
    ``backward``: also d(scalar)/d(stage) for every cached stage, in ``cache.grads``; the scalar is
    the output's loss (``backward=True``: the output itself, or the last item of a tuple such as
    ``(logits, loss)``) or ``backward(output)``. It runs the stages as in ``detach=False``, with
    gradients on (also inside ``torch.no_grad``), and leaves the parameters' ``.grad`` untouched.
    """
    in_graph = not detach or backward is not False
    stages: dict[str, Tensor] = {}

    def saver(name: str) -> HookFn:
        def save(x: Tensor, _: str) -> Tensor | None:
            if backward is not False and not x.requires_grad and x.is_floating_point():
                x = x.detach().requires_grad_()  # a stage nothing trainable feeds (pos): its own leaf
                stages[name] = x
                return x
            stages[name] = x if in_graph else x.detach()
            return None

        return save

    points = hook_points(root)
    derived = {} if names is not None or in_graph else derivations(root, points)
    selected = [name for name in select_names(points, names, getattr(root, "config", None))
                if name not in derived]
    with torch.set_grad_enabled(torch.is_grad_enabled() or backward is not False), \
            hooks(root, {name: saver(name) for name in selected}, observe=not in_graph):
        out = root(*args, **kwargs)
        grads = None if backward is False else _gradients(_scalar(out, backward), stages, retain=not detach)
    if detach:
        stages = {name: t.detach() for name, t in stages.items()}
    return out, ActivationCache(Stages(stages, derived), root, grads)


def derivations(root: nn.Module, points: Mapping[str, nn.Module]) -> dict[str, tuple[str, Derive]]:
    """The stages a full cache derives when read instead of keeping (``Stages``): each head's result
    (kept where the model's ``use_attn_result`` asks, as TransformerLens keeps ``hook_result`` then), the
    probabilities, and a norm's output after gamma and beta where TransformerLens has no name for it."""
    modules = dict(root.named_modules())
    config = getattr(root, "config", None)
    found: dict[str, tuple[str, Derive]] = {}
    for name in points:
        owner = modules.get(name)  # the module whose output this stage is, if any
        if name.endswith("attn.result") and not getattr(root, "use_attn_result", False):
            attention = modules[name.removesuffix(".result")]
            found[name] = (name.removesuffix("result") + "z", attention.results_from_z)
        elif name == "probs":
            found[name] = ("logits", lambda logits: torch.softmax(
                logits if logits.dtype == torch.float64 else logits.float(), dim=-1))
        elif hasattr(owner, "hook_normalized") and not transformerlens_names(name, config):
            found[name] = (name + ".normalized", _affine(owner))
    return found


def _affine(norm: nn.Module) -> Derive:
    def derive(normalized: Tensor) -> Tensor:  # gamma and beta on the normalised vector (float rounding)
        gamma, beta = norm.gamma, getattr(norm, "bias", None)
        out = normalized if gamma is None else normalized * gamma.to(normalized.dtype)
        return out if beta is None else out + beta.to(normalized.dtype)

    return derive


def _scalar(out: object, backward: Backward) -> Tensor:
    """What ``backward`` names: ``backward(out)``, or the output's loss."""
    value = backward(out) if callable(backward) else out[-1] if isinstance(out, tuple) else out
    if not isinstance(value, Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"backward needs a scalar to differentiate, got {shape}: pass targets= so the model "
                         "returns its loss, or backward=fn(output) -> scalar (a logit, a logit difference)")
    return value.reshape(())


def _gradients(scalar: Tensor, stages: dict[str, Tensor], retain: bool) -> dict[str, Tensor]:
    """d scalar / d stage for every stage (zeros where the scalar does not depend on it). Stages that
    are one tensor (a block's output and the next block's resid_pre) are differentiated once."""
    unique = list({id(t): t for t in stages.values() if t.requires_grad}.values())
    found = torch.autograd.grad(scalar, unique, allow_unused=True, retain_graph=retain) if unique else ()
    by_id = {id(t): g for t, g in zip(unique, found, strict=True)}
    return {name: g.detach() if (g := by_id.get(id(t))) is not None else torch.zeros_like(t).detach()
            for name, t in stages.items()}
