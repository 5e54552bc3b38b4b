"""How a training step is measured: tensors saved for backward, live bytes, interleaved timing.

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
- ``time_rounds``: every step once per round, the order rotating (no step always runs first), so
  load from other processes hits all of them alike.
- Reading the rounds: two steps are compared by their time ratio within each round (both ran under
  the same load); the figure is the median of those ratios (``median_ratio``), its uncertainty a
  percentile bootstrap interval of that median (``Bootstrap``), and a target is decided only when
  the whole interval lies on one side of it (``decide``).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
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


def time_rounds(
    steps: dict[str, Callable[[], None]], rounds: int, min_seconds: float, warmup: int = 1,
    before_round: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each step: one measurement per round (repeating a step for at least
    ``min_seconds``), the order rotating each round; ``before_round`` runs before each round."""
    names = list(steps)
    repeats: dict[str, int] = {}
    for name in names:
        for _ in range(warmup):
            steps[name]()
        t0 = time.perf_counter()
        steps[name]()
        repeats[name] = max(1, math.ceil(min_seconds / max(time.perf_counter() - t0, 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        if before_round is not None:
            before_round()
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(repeats[name]):
                steps[name]()
            times[name].append((time.perf_counter() - t0) / repeats[name])
    return times


# ---- reading the rounds -----------------------------------------------------------------------


def within_round_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """num[r] / den[r] for every round r: each ratio compares two steps timed under the same load."""
    return [n / d for n, d in zip(num, den, strict=True)]


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of num[r] / den[r]."""
    return statistics.median(within_round_ratios(num, den))


def percentile_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """The central ``confidence`` share of ``values``: their (1 - c)/2 and (1 + c)/2 quantiles, linearly
    interpolated between order statistics (numpy's default)."""
    shares = [(1 - confidence) / 2, (1 + confidence) / 2]
    low, high = np.quantile(np.asarray(values, dtype=np.float64), shares)
    return float(low), float(high)


@dataclass(frozen=True)
class Bootstrap:
    """Percentile bootstrap of a median: ``resamples`` seeded draws of n values with replacement from
    the n measured ones; the interval is the central ``confidence`` share of the resamples' medians."""

    confidence: float = 0.95
    resamples: int = 10_000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.confidence < 1:
            raise ValueError(f"Bootstrap.confidence={self.confidence} must be between 0 and 1 (exclusive)")
        if self.resamples < 1:
            raise ValueError(f"Bootstrap.resamples={self.resamples} must be at least 1")

    def medians(self, values: Sequence[float]) -> np.ndarray:
        """The median of every resample, (resamples,)."""
        data = np.asarray(values, dtype=np.float64)
        picks = np.random.default_rng(self.seed).integers(0, len(data), size=(self.resamples, len(data)))
        return np.median(data[picks], axis=1)

    def interval(self, values: Sequence[float]) -> tuple[float, float]:
        """(low, high): the ``confidence`` interval of the median of ``values``."""
        return percentile_interval(self.medians(values), self.confidence)


MET, NOT_MET, UNDECIDED = "met", "not met", "interval too wide to decide"


def decide(low: float, high: float, target: float) -> str:
    """Is a figure >= ``target``? ``met`` when its whole interval is, ``not met`` when none of it is,
    else undecided: the measurement cannot tell."""
    if low >= target:
        return MET
    if high < target:
        return NOT_MET
    return UNDECIDED
