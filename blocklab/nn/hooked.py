"""What a hooked module (a block, the stack) offers: its stages, hooks for a with-block or until
reset, ``run_with_cache`` and ``run_with_hooks``; blocklab's calls and TransformerLens' side by side.

    with model.hooks({"blocks.0.attn.weights": fn}): ...                   blocklab: {name or glob: fn}
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", fn)]): ...  TransformerLens
    model.run_with_hooks(tokens, fwd_hooks=[(name or filter, fn)], bwd_hooks=[(name, fn)])
    model.add_hook(name, fn, dir="fwd"); ...; model.reset_hooks()
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_z"))

Every hook function is called ``fn(tensor, hook)`` with the stage's ``HookName``: a string (blocklab's
name), with TransformerLens' ``hook.name``, ``hook.layer()`` and ``hook.ctx`` (a dict kept across calls
until ``clear_contexts``). A forward hook may return a tensor
to replace the stage's value. A backward hook ``fn(grad, hook)`` receives d(output)/d(stage) when
backward runs, and may return a tensor to replace it; backward hooks stay on the graph they were
attached to, so they fire even after ``run_with_hooks`` has removed its hooks. A filter is a name, a
glob, a list of them, or a function of a name (asked with blocklab's name and TransformerLens').
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from torch import Tensor, nn

from .cache import ActivationCache, Backward, run_with_cache
from .hooks import Handle, HookFn, NameFilter, attach, detach, hook_points, on_backward

HookPlan = Sequence[tuple[NameFilter, HookFn]]
DIRECTIONS = ("fwd", "bwd")


class HookedModule(nn.Module):
    """Mixin giving a module ``hooks``, ``run_with_cache``, ``run_with_hooks``, ``add_hook``,
    ``reset_hooks`` and ``hook_names`` over its own hook points."""

    _added: list[tuple[Handle, str, bool]]  # hooks add_hook attached: (handle, direction, permanent)

    def hook_names(self) -> list[str]:
        """Every stage name this module exposes (blocks and models: in the order a forward reaches them)."""
        return list(hook_points(self))

    @contextmanager
    def hooks(
        self, fns: Mapping[str, HookFn] | HookPlan | None = None, observe: bool = False, *,
        fwd_hooks: HookPlan = (), bwd_hooks: HookPlan = (), reset_hooks_end: bool = True,
        clear_contexts: bool = False,
    ) -> Iterator[HookedModule]:
        """Attach hooks for the with-block: ``{name_or_glob: fn}`` as interventions (or observers with
        ``observe``), or TransformerLens' ``fwd_hooks=[(name or filter, fn)]`` and ``bwd_hooks``.
        ``reset_hooks_end=False`` leaves them attached after the block (remove with ``reset_hooks``);
        ``clear_contexts`` empties every ``hook.ctx`` when the hooks go."""
        if fns is not None and (fwd_hooks or bwd_hooks):
            raise ValueError("hooks takes {name: fn} or fwd_hooks/bwd_hooks, not both")
        if observe and not isinstance(fns, Mapping):
            raise ValueError("observe=True goes with {name: fn}: TransformerLens' hooks may replace values")
        # a list given as the first argument is TransformerLens' fwd_hooks: [(name or filter, fn)]
        forward = list(fns.items()) if isinstance(fns, Mapping) else [*(fns or ()), *fwd_hooks]
        handles = {"fwd": attach(self, forward, observe),
                   "bwd": attach(self, bwd_hooks, wrap=on_backward)}
        try:
            yield self
        finally:
            if reset_hooks_end:
                detach([*handles["fwd"], *handles["bwd"]])
                if clear_contexts:
                    self.clear_contexts()
            else:
                for direction, attached in handles.items():
                    self._remember(attached, direction, permanent=False)

    def run_with_hooks(
        self, *args: object, fwd_hooks: HookPlan = (), bwd_hooks: HookPlan = (), reset_hooks_end: bool = True,
        clear_contexts: bool = False, **kwargs: object,
    ) -> object:
        """The forward pass with TransformerLens-style hooks attached for it: ``fwd_hooks`` and
        ``bwd_hooks`` are ``[(name or filter, fn)]``; the hooks go after the call unless
        ``reset_hooks_end=False``."""
        with self.hooks(fwd_hooks=fwd_hooks, bwd_hooks=bwd_hooks, reset_hooks_end=reset_hooks_end,
                        clear_contexts=clear_contexts):
            return self(*args, **kwargs)

    def add_hook(self, name: NameFilter, hook: HookFn, dir: str = "fwd", is_permanent: bool = False,
                 prepend: bool = False) -> None:
        """Attach ``hook`` to the stages ``name`` selects until ``reset_hooks`` (TransformerLens'
        ``add_hook``; ``dir`` "fwd" or "bwd"; a permanent hook survives ``reset_hooks()``)."""
        if dir not in DIRECTIONS:
            raise ValueError(f"dir={dir!r} is not one of: {', '.join(DIRECTIONS)}")
        handles = attach(self, [(name, hook)], wrap=None if dir == "fwd" else on_backward)
        if prepend:  # run before the hooks already there
            for where, fn in handles:
                where.remove(fn)
                where.insert(0, fn)
        self._remember(handles, dir, is_permanent)

    def reset_hooks(self, clear_contexts: bool = True, direction: str = "both",
                    including_permanent: bool = False) -> None:
        """Remove the hooks ``add_hook`` (or a kept ``hooks`` block) attached in ``direction`` ("fwd",
        "bwd" or "both"); permanent ones only with ``including_permanent``; ``clear_contexts`` empties
        every ``hook.ctx``."""
        if direction not in (*DIRECTIONS, "both"):
            raise ValueError(f"direction={direction!r} is not one of: fwd, bwd, both")
        added = getattr(self, "_added", [])

        def goes(d: str, permanent: bool) -> bool:
            return direction in ("both", d) and (including_permanent or not permanent)

        detach(h for h, d, permanent in added if goes(d, permanent))
        self._added = [(h, d, permanent) for h, d, permanent in added if not goes(d, permanent)]
        for point in hook_points(self).values():  # and what a hook point's own add_hook attached
            point.remove_hooks(direction, including_permanent)
        if clear_contexts:
            self.clear_contexts()

    def clear_contexts(self) -> None:
        """Empty every stage's ``hook.ctx`` (TransformerLens' per-hook scratch dict)."""
        for point in hook_points(self).values():
            point.clear_context()

    def _remember(self, handles: Iterable[Handle], direction: str, permanent: bool) -> None:
        self._added = [*getattr(self, "_added", []), *((h, direction, permanent) for h in handles)]

    def run_with_cache(
        self, *args: object, names: NameFilter = None, names_filter: NameFilter = None, detach: bool = True,
        backward: Backward = False, remove_batch_dim: bool = False, return_cache_object: bool = True,
        **kwargs: object,
    ) -> tuple[object, ActivationCache | dict[str, Tensor]]:
        """``output, cache = module.run_with_cache(inputs)``: every (or the named) stage's tensor.
        ``names_filter`` is TransformerLens' name for ``names``; ``remove_batch_dim`` drops a batch of one.
        The cache's keys follow how the stages were asked for: TransformerLens' names with ``names_filter``
        or no filter (as TransformerLens code iterates them: ``k.endswith("hook_pattern")``), blocklab's
        with ``names``; either spelling indexes it. ``return_cache_object=False``: a plain dict of those keys
        and tensors instead (TransformerLens')."""
        if names is not None and names_filter is not None:
            raise ValueError("run_with_cache takes names or names_filter (the same thing), not both")
        out, cache = run_with_cache(self, *args, names=names if names is not None else names_filter,
                                    detach=detach, backward=backward, **kwargs)
        cache = cache.with_transformerlens_keys(names is None)
        cache = cache.remove_batch_dim() if remove_batch_dim else cache
        return out, cache if return_cache_object else dict(cache.items())

