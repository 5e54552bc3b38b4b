"""Hook points: a stable name on every stage of the block, an activation cache, hook contexts.

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
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

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

    def __iadd__(self, fns: Iterable[HookFn]):  # noqa: ANN204
        self.extend(fns)
        return self

    def __imul__(self, n: int):  # noqa: ANN204
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

    def __delitem__(self, index) -> None:  # noqa: ANN001
        before = len(self)
        super().__delitem__(index)
        self._count(len(self) - before)

    def __setitem__(self, index, value) -> None:  # noqa: ANN001
        before = len(self)
        super().__setitem__(index, value)
        self._count(len(self) - before)

    def __del__(self) -> None:  # a model dropped with hooks still on them: uncount them
        if HookPoint is not None:  # None during interpreter shutdown
            HookPoint.attached -= len(self)


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
        self.name = ""
        self.fns = _HookFns()
        self.observers = _HookFns()

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("fns", "observers") and not isinstance(value, _HookFns):  # a plain list: count it too
            value = _HookFns(value)  # type: ignore[arg-type]
        super().__setattr__(name, value)

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
            out = fn(x, self.name)
            if out is not None:
                x = out
        self._tell_observers(x)
        return x

    def see(self, x: Tensor) -> None:
        """Show the observers a stage the running (lean) path materialises but would not let an
        intervention replace; interventions send the caller down its module path instead."""
        if self.fns:
            raise RuntimeError(f"{self.name}: an intervention is attached, so this path must not run")
        self._tell_observers(x)

    def observe(self, compute: Callable[[], Tensor]) -> None:
        """Show the observers a stage the running path does not materialise: ``compute()`` runs
        (without autograd) only when an observer is attached, and its result feeds nothing else."""
        if self.observers:
            with torch.no_grad():
                self._tell_observers(compute())

    def _tell_observers(self, x: Tensor) -> None:
        for fn in self.observers:
            if fn(x, self.name) is not None:
                raise ValueError(
                    f"an observer of {self.name or 'a hook point'} returned a value; observers only read "
                    "(attach it with hooks(...) to replace the stage's value)"
                )

    def forward(self, x: Tensor) -> Tensor:
        return self(x)

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


def any_attached(points: Iterable[HookPoint]) -> bool:
    """Whether a hook function of either kind is attached to any of ``points`` (free while none is
    attached anywhere)."""
    return HookPoint.attached > 0 and any(p.fns or p.observers for p in points)


def any_intervention(points: Iterable[HookPoint]) -> bool:
    """Whether an intervention is attached to any of ``points`` (free while no hook is attached anywhere)."""
    return HookPoint.attached > 0 and any(p.fns for p in points)


def stage_name(module_path: str) -> str:
    """``blocks.0.attn.hook_q`` -> ``blocks.0.attn.q``."""
    parts = module_path.split(".")
    parts[-1] = parts[-1].removeprefix("hook_")
    return ".".join(parts)


def name_hook_points(root: nn.Module) -> None:
    """Give every HookPoint below ``root`` its stage name (called once at construction).

    Each HookPoint is also put in its parent's instance ``__dict__``: ``self.hook_x`` then
    resolves as a plain attribute instead of through ``nn.Module.__getattr__``, which is
    most of what an unused hook would otherwise cost. Assigning a new module to the same
    attribute goes through ``nn.Module.__setattr__``, which drops that entry again.
    """
    for path, module in root.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, HookPoint):
                child.name = stage_name(f"{path}.{child_name}" if path else child_name)
                module.__dict__[child_name] = child


def hook_points(root: nn.Module) -> dict[str, HookPoint]:
    """All hook points below ``root`` by stage name relative to ``root``, in construction order."""
    return {stage_name(path): m for path, m in root.named_modules() if isinstance(m, HookPoint)}


def select_names(names: Iterable[str], wanted: NameFilter) -> list[str]:
    """Stage names matching ``wanted``: None (all), a name or glob, a list of them, or a predicate.

    A name or glob that matches nothing is a ValueError that suggests the closest names.
    """
    names = list(names)
    if wanted is None:
        return names
    if callable(wanted):
        return [n for n in names if wanted(n)]
    patterns = [wanted] if isinstance(wanted, str) else list(wanted)
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        close = difflib.get_close_matches(unmatched[0], names, n=3, cutoff=0.6)
        hint = (f"did you mean {', '.join(close)}?" if close else
                f"names look like {', '.join(names[:6])}, ...")
        raise ValueError(f"no hook point matches {', '.join(map(repr, unmatched))}; {hint}")
    return chosen


@contextmanager
def hooks(root: nn.Module, fns: Mapping[str, HookFn], observe: bool = False) -> Iterator[None]:
    """Attach ``{name_or_glob: fn}`` to the hook points below ``root`` for the with-block: as
    interventions (a returned tensor replaces the stage's value), or with ``observe`` as observers
    (read only; the model computes exactly what it computes unobserved).

    Every name is checked before anything is attached; the hooks are removed on exit,
    also when the block raises.
    """
    points = hook_points(root)
    plan = [(points[name], name, fn) for pattern, fn in fns.items() for name in select_names(points, pattern)]
    attached: list[tuple[_HookFns, HookFn]] = []
    try:
        for point, name, fn in plan:
            point.name = point.name or name  # a standalone component was never named by a model
            where = point.observers if observe else point.fns
            where.append(fn)
            attached.append((where, fn))
        yield
    finally:
        for where, fn in attached:
            where.remove(fn)


def run_with_cache(
    root: nn.Module, *args: object, names: NameFilter = None, detach: bool = True, **kwargs: object
) -> tuple[object, dict[str, Tensor]]:
    """Run ``root(*args, **kwargs)`` and return (its output, {stage name: tensor}).

    Names are relative to ``root`` and the cache is in the order the stages ran. The cache
    observes (``detach=True``): the output is what ``root`` computes unobserved, bit for bit.
    ``detach=False`` keeps each stage in the autograd graph, as the tensor the forward used: the
    blocks then run module by module (forward values unchanged; gradients agree to rounding).
    """
    cache: dict[str, Tensor] = {}

    def saver(name: str) -> HookFn:
        def save(x: Tensor, _: str) -> None:
            cache[name] = x.detach() if detach else x

        return save

    selected = select_names(hook_points(root), names)
    with hooks(root, {name: saver(name) for name in selected}, observe=detach):
        out = root(*args, **kwargs)
    return out, cache


class HookedModule(nn.Module):
    """Mixin giving a module ``run_with_cache`` and ``hooks`` over its own hook points."""

    def hook_names(self) -> list[str]:
        """Every stage name this module exposes."""
        return list(hook_points(self))

    def hooks(self, fns: Mapping[str, HookFn], observe: bool = False):  # noqa: ANN201 - a context manager
        """Context manager attaching ``{name_or_glob: fn}`` for the with-block (interventions, or
        observers with ``observe``)."""
        return hooks(self, fns, observe)

    def run_with_cache(self, *args: object, names: NameFilter = None, **kwargs: object):  # noqa: ANN201
        """``output, cache = module.run_with_cache(inputs)``: every (or the named) stage's tensor."""
        return run_with_cache(self, *args, names=names, **kwargs)
