"""How much memory a training step holds: the tensors saved for backward and the live bytes.

- ``saved_activations``: what autograd keeps for backward after one forward, captured with
  ``torch.autograd.graph.saved_tensors_hooks``. Each saved tensor is mapped to its storage and
  every storage counts once, whole (a view keeps all of its storage alive). Storages of the
  module's parameters and buffers are excluded: they are not activations. The input counts: in a
  stack it is the previous block's output, kept alive only because this block saved it.
  (A checkpointed region keeps its inputs outside autograd's saved tensors; ``step_memory``
  sees them.)
- ``step_memory``: bytes of the storages created by ops during the step, tracked op by op with a
  dispatch mode (a storage counts from the op that allocates it until it is freed; views and
  in-place results are not new memory). Parameters and the input batch existed before the step and
  are not counted; gradients are.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


@dataclass
class SavedTensors:
    """What autograd keeps for backward: {storage: (bytes, shape of a tensor viewing it, dtype)}."""

    storages: dict[int, tuple[int, tuple[int, ...], str]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(entry[0] for entry in self.storages.values())


def saved_activations(
    module: nn.Module, run: Callable[[Tensor], Tensor], x: Tensor
) -> tuple[SavedTensors, Tensor]:
    """(every storage saved for backward during ``run(x)``, the output); parameters, buffers excluded."""
    state = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    saved = SavedTensors()

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in state and key not in saved.storages:
            saved.storages[key] = (storage.nbytes(), tuple(t.shape), str(t.dtype).removeprefix("torch."))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(x)
    return saved, out


def saved_by(out: Tensor) -> dict[int, list[str]]:
    """{storage: names of the autograd nodes that saved it}, walking the graph behind ``out``."""
    names: dict[int, list[str]] = {}
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        values = list(getattr(node, "saved_tensors", ()) or ())  # custom autograd.Functions
        values += [getattr(node, a) for a in dir(node) if a.startswith("_saved_")]  # built-in nodes
        for value in tree_leaves(values):
            if isinstance(value, Tensor):
                names.setdefault(value.untyped_storage().data_ptr(), []).append(node.name())
        stack.extend(fn for fn, _ in node.next_functions)
    return names


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages ops allocate while active: ``live`` now, ``peak`` the maximum so far."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}

    def _freed(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self._sizes and key not in inputs:  # new memory, not a view or in-place
                    self._sizes[key] = storage.nbytes()
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._freed, key)
        self.peak = max(self.peak, self.live)
        return out


def clear_grads(module: nn.Module, x: Tensor) -> None:
    """Drop the gradients a step left (each step then allocates its own, as in training)."""
    for p in module.parameters():
        p.grad = None
    x.grad = None


def step_memory(module: nn.Module, run: Callable[[Tensor], Tensor], x: Tensor) -> tuple[int, int]:
    """(bytes held after the forward, peak bytes during forward + backward) of one step's tensors."""
    with LiveBytes() as live:
        out = run(x)
        held = live.live  # what the forward keeps for backward, and its output
        out.backward(torch.ones_like(out))
        del out
        clear_grads(module, x)
    return held, live.peak
