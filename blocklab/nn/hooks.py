"""Hook points: a stable name on every stage of the block, hook contexts, TransformerLens's names.

A ``HookPoint`` is an identity module placed on each stage named in docs/concepts.md#tracer-stages
(``self.hook_out(self.w2(a))``). Its stage name is its module path without the ``hook_``
prefix: ``blocks.0.ffn.hook_out`` is the stage ``blocks.0.ffn.out``. With no hook attached it
returns its input untouched, at the cost of one Python call (``benchmarks/hooks_overhead.py``
measures it against the same model with the calls removed).

Two kinds of hook function, ``fn(tensor, name)``:

- an **intervention** (``hooks``) may return a tensor to replace the stage's value (ablate, patch).
  The block then runs module by module, so that every stage exists as a tensor to replace.
- an **observer** (``hooks(..., observe=True)``, ``run_with_cache``, the tracer, the NaN detector)
  only reads. Observing never changes what is computed: the block keeps the path it would take
  unobserved, and a stage that path does not materialise (LN1's output inside a fused kernel,
  attention weights inside SDPA) is computed beside it, from the tensors it has, for the observers
  alone (``HookPoint.observe``). Same numbers to the last bit, observed or not.

Every function taking stage names also takes TransformerLens's (``blocks.0.attn.hook_pattern``)
and the hook points' module paths (``blocks.0.hook_resid_mid``): ``hook_names.TRANSFORMERLENS_ALIASES``
is the one table of them (docs/tracer.md shows it). ``run_with_cache`` and the activation cache are
in nn/cache.py.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .hook_names import (
    blocklab_name,
    in_transformerlens_layout,
    stage_name,
    transformerlens_name,
)

HookFn = Callable[[Tensor, str], Tensor | None]
NameFilter = None | str | Iterable[str] | Callable[[str], bool]


class _HookFns(list):
    """A hook point's functions; every live entry is counted in ``HookPoint.attached``."""

    def __init__(self, fns: Iterable[HookFn] = ()) -> None:
        super().__init__()
        self.extend(fns)

    def _count(self, change: int) -> None:
        HookPoint.attached += change

    def append(self, fn: HookFn) -> None:
        super().append(fn)
        self._count(1)

    def insert(self, index: int, fn: HookFn) -> None:  # type: ignore[override]
        super().insert(index, fn)
        self._count(1)

    def extend(self, fns: Iterable[HookFn]) -> None:
        before = len(self)
        super().extend(fns)
        self._count(len(self) - before)

    def __iadd__(self, fns: Iterable[HookFn]):
        self.extend(fns)
        return self

    def __imul__(self, n: int):
        before = len(self)
        super().__imul__(n)
        self._count(len(self) - before)
        return self

    def remove(self, fn: HookFn) -> None:
        super().remove(fn)
        self._count(-1)

    def pop(self, index: int = -1) -> HookFn:  # type: ignore[override]
        fn = super().pop(index)
        self._count(-1)
        return fn

    def clear(self) -> None:
        self._count(-len(self))
        super().clear()

    def __delitem__(self, index) -> None:
        before = len(self)
        super().__delitem__(index)
        self._count(len(self) - before)

    def __setitem__(self, index, value) -> None:
        before = len(self)
        super().__setitem__(index, value)
        self._count(len(self) - before)

    def __del__(self) -> None:  # a model dropped with hooks still on them: uncount them
        if HookPoint is not None:  # None during interpreter shutdown
            HookPoint.attached -= len(self)


class HookName(str):
    """A stage's name as a hook function receives it: the string is blocklab's name
    (``blocks.0.attn.weights``), so ``fn(x, name)`` code keeps working, and it has TransformerLens'
    hook attributes, so ``fn(x, hook)`` code reading ``hook.name`` or ``hook.layer()`` runs unchanged:
    ``.name`` is TransformerLens' name for the stage (``blocks.0.attn.hook_pattern``) where it has one,
    else blocklab's: on a model, the name TransformerLens' model of its ``config`` has (``name_hook_points``
    sets it; the sandwich block's ``ln1_out`` is ``blocks.0.hook_attn_out`` there)."""

    config: object | None = None  # the model's ModelConfig, where a model named the stage

    @property
    def name(self) -> str:
        return transformerlens_name(self, self.config)

    @property
    def ctx(self) -> dict:
        """TransformerLens' per-hook scratch dict: kept across calls until a ``clear_contexts``."""
        return self.__dict__.setdefault("_ctx", {})

    def layer(self) -> int:
        """The block the stage is in (``blocks.3.ln1`` -> 3); a ValueError for stages outside blocks."""
        parts = self.split(".")
        if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
            raise ValueError(f"{str(self)!r} is not a stage of a block: it has no layer")
        return int(parts[1])


class HookPoint(nn.Module):
    """Identity on a named stage; runs attached hook functions when there are any.

    ``fns`` are interventions (their return value replaces the stage's), ``observers`` only read.
    ``HookPoint.attached`` counts the functions of both kinds attached to all hook points in the
    process (never fewer), so "is any hook attached?" costs one read while there are none
    (``any_attached``).
    """

    attached = 0

    def __init__(self) -> None:
        super().__init__()
        self.stage = HookName("")  # blocklab's stage name, as hook functions receive it
        self.fns = _HookFns()
        self.observers = _HookFns()
        self._added: list[tuple[HookFn, str, bool]] = []  # add_hook's: (fn in fns, direction, permanent)

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("fns", "observers") and not isinstance(value, _HookFns):  # a plain list: count it too
            value = _HookFns(value)  # type: ignore[arg-type]
        if name == "stage" and not isinstance(value, HookName):
            value = HookName(value)
        super().__setattr__(name, value)

    @property
    def name(self) -> str:
        """TransformerLens' name for the stage (``blocks.0.attn.hook_z``), blocklab's where it has none;
        ``stage`` is blocklab's (``blocks.0.attn.z``)."""
        return self.stage.name

    @property
    def ctx(self) -> dict:
        """TransformerLens' per-hook scratch dict (``HookName.ctx``)."""
        return self.stage.ctx

    def clear_context(self) -> None:
        """Empty ``ctx`` (TransformerLens' ``HookPoint.clear_context``)."""
        self.stage.ctx.clear()

    def layer(self) -> int:
        """The block the stage is in (``HookName.layer``)."""
        return self.stage.layer()

    def add_hook(self, hook: HookFn, dir: str = "fwd", is_permanent: bool = False, level: None = None,
                 prepend: bool = False) -> None:
        """TransformerLens' ``HookPoint.add_hook``: ``hook(tensor, hook)`` on this stage until
        ``remove_hooks``, receiving (and returning) the tensor in TransformerLens' layout (q, k, v as
        (B, T, h, d_head)); ``dir="bwd"``: on the stage's gradient. TransformerLens' hook ``level``s (its
        nested ``hooks()`` contexts) are refused: blocklab's ``model.hooks(...)`` with-block scopes hooks."""
        _no_level(level)
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir={dir!r} is not one of: fwd, bwd")
        _not_another_stage(self.stage)
        fn = in_transformerlens_layout(hook, self.stage)
        fn = on_backward(fn) if dir == "bwd" else fn
        if prepend:
            self.fns.insert(0, fn)
        else:
            self.fns.append(fn)
        self._added.append((fn, dir, is_permanent))

    def remove_hooks(self, dir: str = "fwd", including_permanent: bool = False, level: None = None) -> None:
        """Remove what ``add_hook`` attached in ``dir`` ("fwd", "bwd" or "both"; permanent ones only with
        ``including_permanent``), as TransformerLens' ``HookPoint.remove_hooks``."""
        _no_level(level)
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir={dir!r} is not one of: fwd, bwd, both")
        going = [(fn, d, permanent) for fn, d, permanent in self._added
                 if dir in ("both", d) and (including_permanent or not permanent)]
        for fn, _, _ in going:
            if fn in self.fns:
                self.fns.remove(fn)
        self._added = [entry for entry in self._added if entry not in going]

    @property
    def active(self) -> bool:
        """Whether any hook is attached (lets callers skip computing optional stages)."""
        return bool(self.fns) or bool(self.observers)

    @property
    def intervened(self) -> bool:
        """Whether an intervention is attached (a function that may replace the stage's value)."""
        return bool(self.fns)

    def __call__(self, x: Tensor) -> Tensor:  # bypasses nn.Module's call machinery: free when unused
        if not self.fns and not self.observers:
            return x
        for fn in self.fns:
            out = fn(x, self.stage)
            if out is not None:
                x = out
        self._tell_observers(x)
        return x

    def see(self, x: Tensor) -> None:
        """Show the observers a stage the running (lean) path materialises but would not let an
        intervention replace; interventions send the caller down its module path instead."""
        if self.fns:
            raise RuntimeError(f"{self.stage}: an intervention is attached, so this path must not run")
        self._tell_observers(x)

    def observe(self, compute: Callable[[], Tensor]) -> None:
        """Show the observers a stage the running path does not materialise: ``compute()`` runs
        (without autograd) only when an observer is attached, and its result feeds nothing else."""
        if self.observers:
            with torch.no_grad():
                self._tell_observers(compute())

    def _tell_observers(self, x: Tensor) -> None:
        for fn in self.observers:
            if fn(x, self.stage) is not None:
                raise ValueError(
                    f"an observer of {self.stage or 'a hook point'} returned a value; observers only read "
                    "(attach it with hooks(...) to replace the stage's value)"
                )

    def forward(self, x: Tensor) -> Tensor:
        return self(x)

    def extra_repr(self) -> str:
        return f"stage={str(self.stage)!r}"


def on_backward(fn: HookFn) -> HookFn:
    """A forward intervention that registers ``fn`` on the stage's gradient (TransformerLens' bwd hook)."""

    def register(x: Tensor, hook: HookName) -> None:
        if x.requires_grad:
            x.register_hook(lambda grad: fn(grad, hook))

    return register


def _not_another_stage(stage: str) -> None:
    """Refuse TransformerLens' ``add_hook`` on a hook point whose attribute is TransformerLens' name for
    another stage (``model.hook_embed`` is blocklab's x0; TransformerLens' ``hook_embed``, the token part)."""
    *outer, last = stage.split(".")
    path = ".".join([*outer, f"hook_{last}"])  # where the hook point sits, as an attribute
    if stage and blocklab_name(path) != stage:
        raise ValueError(f"{path} is blocklab's stage {stage!r}; TransformerLens' {path} is blocklab's "
                         f"{blocklab_name(path)!r}: add TransformerLens' hook through "
                         f"model.hook_dict[{path!r}] (or to this stage with model.add_hook({stage!r}, fn))")


def _no_level(level: object) -> None:
    if level is not None:
        raise ValueError(f"level={level!r}: TransformerLens' hook levels (its nested hooks() contexts) have "
                         "no blocklab counterpart; scope hooks with model.hooks(...) or reset them with "
                         "remove_hooks / model.reset_hooks")


def any_attached(points: Iterable[HookPoint]) -> bool:
    """Whether a hook function of either kind is attached to any of ``points`` (free while none is
    attached anywhere)."""
    return HookPoint.attached > 0 and any(p.fns or p.observers for p in points)


def any_intervention(points: Iterable[HookPoint]) -> bool:
    """Whether an intervention is attached to any of ``points`` (free while no hook is attached anywhere)."""
    return HookPoint.attached > 0 and any(p.fns for p in points)


def name_hook_points(root: nn.Module) -> None:
    """Give every HookPoint below ``root`` its stage name (called once at construction).

    Each HookPoint is also put in its parent's instance ``__dict__``: ``self.hook_x`` then
    resolves as a plain attribute instead of through ``nn.Module.__getattr__``, which is
    most of what an unused hook would otherwise cost. Assigning a new module to the same
    attribute goes through ``nn.Module.__setattr__``, which drops that entry again.
    """
    config = getattr(root, "config", None)  # TransformerLens' names for the stages depend on the model
    for path, module in root.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, HookPoint):
                child.stage = stage_name(f"{path}.{child_name}" if path else child_name)
                child.stage.config = config
                module.__dict__[child_name] = child


def hook_points(root: nn.Module) -> dict[str, HookPoint]:
    """All hook points below ``root`` by stage name relative to ``root``, in construction order."""
    return {stage_name(path): m for path, m in root.named_modules() if isinstance(m, HookPoint)}


def select_names(names: Iterable[str], wanted: NameFilter, config: object | None = None) -> list[str]:
    """Stage names matching ``wanted``: None (all), a name or glob, a list of them, or a predicate.

    Names and globs may be written as TransformerLens writes them (``blocks.*.attn.hook_pattern``)
    or as module paths (``blocks.0.hook_resid_mid``): ``blocklab_name`` translates them. A
    predicate is asked with blocklab's name and with TransformerLens' (``lambda n: n.endswith("hook_z")``
    works as in TransformerLens); either true selects the stage. A name or glob that matches nothing
    is a ValueError that suggests the closest names, as is a TransformerLens name that its model of
    ``config`` (the model's, where the names are its stages) uses for another tensor.
    """
    return list(select_spelled(names, wanted, config))


def select_spelled(names: Iterable[str], wanted: NameFilter, config: object | None = None) -> dict[str, bool]:
    """``select_names``' stages, each with whether ``wanted`` chose it in TransformerLens' words (a name or
    glob with a ``hook_`` part, or a predicate true of TransformerLens' name and not of blocklab's): such
    a stage is given in TransformerLens' layout where the two differ (``relaid_for_transformerlens``)."""
    names = list(names)
    if wanted is None:
        return dict.fromkeys(names, False)
    if callable(wanted):
        chosen: dict[str, bool] = {}
        for n in names:
            if wanted(n):
                chosen[n] = False
            elif (tl := transformerlens_name(n, config)) != n and wanted(tl):
                chosen[n] = True
        return chosen
    written = [wanted] if isinstance(wanted, str) else list(wanted)
    patterns = {p: blocklab_name(p, config) for p in written}  # as written -> in blocklab's words
    chosen = {n: all("hook_" in w for w, p in patterns.items() if fnmatch.fnmatchcase(n, p))
              for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns.values())}
    unmatched = [(w, p) for w, p in patterns.items() if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        close = difflib.get_close_matches(unmatched[0][1], names, n=3, cutoff=0.6)
        hint = (f"did you mean {', '.join(close)}?" if close else
                f"names look like {', '.join(names[:6])}, ...")
        what = ", ".join(repr(p) if w == p else f"{w!r} ({p!r})" for w, p in unmatched)
        raise ValueError(f"no hook point matches {what}; {hint}")
    return chosen


Handle = tuple[_HookFns, HookFn]  # where a function was attached, and the function: to detach it


def attach(root: nn.Module, plan: Iterable[tuple[NameFilter, HookFn]], observe: bool = False,
           wrap: Callable[[HookFn], HookFn] | None = None) -> list[Handle]:
    """Attach each ``(name, glob, list or predicate; fn)`` to the hook points below ``root`` it selects:
    as interventions (a returned tensor replaces the stage's value), or with ``observe`` as observers.
    A stage chosen in TransformerLens' words reaches ``fn`` in TransformerLens' layout; ``wrap`` then
    applies to that (a backward hook's registration). Every name is checked before anything is
    attached. Returns the handles ``detach`` takes."""
    points = hook_points(root)
    chosen = []
    for wanted, fn in plan:
        for name, spelled_tl in select_spelled(points, wanted, getattr(root, "config", None)).items():
            seen = in_transformerlens_layout(fn, name) if spelled_tl else fn
            chosen.append((points[name], name, wrap(seen) if wrap else seen))
    handles: list[Handle] = []
    for point, name, fn in chosen:
        point.stage = point.stage or name  # a standalone component was never named by a model
        where = point.observers if observe else point.fns
        where.append(fn)
        handles.append((where, fn))
    return handles


def detach(handles: Iterable[Handle]) -> None:
    """Remove what ``attach`` attached (each once; one already removed is skipped)."""
    for where, fn in handles:
        if fn in where:
            where.remove(fn)


@contextmanager
def hooks(root: nn.Module, fns: Mapping[str, HookFn] | Iterable[tuple[NameFilter, HookFn]],
          observe: bool = False) -> Iterator[None]:
    """Attach ``{name_or_glob: fn}`` (or TransformerLens' ``[(name_or_filter, fn)]``) to the hook points
    below ``root`` for the with-block: as interventions (a returned tensor replaces the stage's
    value), or with ``observe`` as observers (read only; the model computes exactly what it
    computes unobserved). Every name is checked before anything is attached; the hooks are
    removed on exit, also when the block raises."""
    handles = attach(root, fns.items() if isinstance(fns, Mapping) else fns, observe)
    try:
        yield
    finally:
        detach(handles)
