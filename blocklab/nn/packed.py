"""Weights laid out for decoding one token at a time (issue 38): the decode step's matmuls at memory speed.

Decoding one token of one sequence multiplies a single row by every weight matrix: each weight is read
once per token, so the step's time is how fast the matrix-vector product streams the weights. On CPU
(MKL, one thread) that depends on the layout. Measured per token for GPT-2 small's matrices
(``benchmarks/generate.py`` records the whole effect):

    W (out, in) as nn.Linear keeps it     x @ W.T        row-major GEMV:    ~1.5x a plain read of W
    the same numbers stored (in, out)     x @ W_t        column-major GEMV: ~1.1-1.4x a plain read of W

The column-major product wins where the output is at least as wide as the input (q|k|v, W1|W3, the LM
head: 12 ms -> 6 ms for GPT-2's 50257 x 768) and loses where it is narrower (W2: d_ff -> d), so each
weight keeps the layout that streams: ``packed_linear`` transposes a weight whose output is at least as
wide as its input and leaves the others as they are (no copy). Matrices applied to the same input (q, k,
v; W1, W3) are concatenated first, as the training path's one matmul does.

The packed copies cost memory (for GPT-2 small about 0.8x the weights), so they are made only inside
``packed_decoding()`` (``generate`` enters it unless ``GenerationConfig.pack_weights`` is False) and only
for steps of one row; they are kept between calls, keyed by their module, and rebuilt when a source
tensor changed: its storage (``p.data = ...``, ``model.to(...)``) or its version counter (an optimizer
step, ``load_state_dict``, any in-place edit). ``release_packed(model)`` frees them; so does the module's
end (the cache holds it weakly).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_PACKING: ContextVar[bool] = ContextVar("blocklab_packed_decoding", default=False)


@contextlib.contextmanager
def packed_decoding(enabled: bool = True) -> Iterator[None]:
    """Within: one-row steps run without autograd read packed weights (``packed_linear``)."""
    token = _PACKING.set(enabled)
    try:
        yield
    finally:
        _PACKING.reset(token)


def packing(x: Tensor, *linears: nn.Module) -> bool:
    """Whether a matmul of x (..., in) reads packed weights: inside ``packed_decoding``, autograd off, x one
    row (a batch of one decoding one token) on the CPU (the layouts were measured with its BLAS; a GPU's
    reads its weights as they are), and no PyTorch hook on the ``linears`` it stands for (the packed matmul
    does not call them; their hooks must still run)."""
    return _PACKING.get() and not torch.is_grad_enabled() and x.numel() == x.shape[-1] \
        and x.device.type == "cpu" and not any(
        m._forward_hooks or m._forward_pre_hooks or nn.modules.module._global_forward_hooks
        or nn.modules.module._global_forward_pre_hooks for m in linears)


class _Packed:
    """One packed weight: the concatenation of its sources, transposed to (in, out) when ``transposed``,
    the concatenated bias, and the source tensors and versions it was made from."""

    def __init__(self, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> None:
        self.sources = [t.detach() for t in (*weights, *biases)]
        self.versions = [_version(t) for t in self.sources]
        weight = weights[0].detach() if len(weights) == 1 else torch.cat([w.detach() for w in weights])
        self.transposed = weight.shape[0] >= weight.shape[1]  # out >= in: the column-major GEMV streams
        self.weight = weight.t().contiguous() if self.transposed else weight  # (in, out) | (out, in)
        self.bias = None if not biases else biases[0].detach() if len(biases) == 1 else torch.cat(
            [b.detach() for b in biases])

    @property
    def copied_bytes(self) -> int:
        """The memory of the copy (0 for a single weight kept in its layout: it is the parameter itself)."""
        shared = self.weight.data_ptr() == self.sources[0].data_ptr()
        return 0 if shared else self.weight.numel() * self.weight.element_size()

    def current(self, weights: Sequence[Tensor], biases: Sequence[Tensor]) -> bool:
        """Whether the sources are the same tensors, unchanged since packing. The sources are held, so
        their storage cannot be freed and reused at the same address by a replacement."""
        now = (*weights, *biases)
        return len(now) == len(self.sources) and all(
            t.data_ptr() == s.data_ptr() and t.shape == s.shape and t.dtype == s.dtype and _version(t) == v
            for t, s, v in zip(now, self.sources, self.versions, strict=True))

    def apply(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        if not self.transposed:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])  # (1, in)
        out = rows @ self.weight if self.bias is None else torch.addmm(self.bias, rows, self.weight)
        return out.view(*x.shape[:-1], self.weight.shape[1])


def _version(t: Tensor) -> int:
    # an inference tensor has no version counter; it cannot be edited in place outside inference mode
    return -1 if t.is_inference() else t._version


_CACHE: weakref.WeakKeyDictionary[nn.Module, dict[str, _Packed]] = weakref.WeakKeyDictionary()


def packed_linear(owner: nn.Module, name: str, x: Tensor, weights: Sequence[Tensor],
                  biases: Sequence[Tensor | None] = ()) -> Tensor:  # (..., in) -> (..., sum of the outputs)
    """x @ cat(weights).T + cat(biases) through ``owner``'s packed copy named ``name``, made now if it is
    missing or stale; ``biases`` one per weight, or empty or all None (no bias). Same values as
    ``F.linear(x, torch.cat(weights), torch.cat(biases))`` to float rounding."""
    biases = [b for b in biases if b is not None]
    if biases and len(biases) != len(weights):
        raise ValueError(f"packed_linear {name!r}: {len(biases)} biases for {len(weights)} weights "
                         "(one per weight, or none)")
    entries = _CACHE.setdefault(owner, {})
    entry = entries.get(name)
    if entry is None or not entry.current(weights, biases):
        entries.pop(name, None)  # a stale copy is freed before its replacement is made
        entries[name] = entry = _Packed(weights, biases)
    return entry.apply(x)


def release_packed(model: nn.Module) -> int:
    """Free every packed copy of ``model``'s modules; returns the bytes freed."""
    freed = packed_bytes(model)
    for module in model.modules():
        _CACHE.pop(module, None)
    return freed


def packed_bytes(model: nn.Module) -> int:
    """The bytes ``model``'s packed copies hold (the copies only: a weight kept as it is costs nothing)."""
    return sum(entry.copied_bytes for module in model.modules() for entry in _CACHE.get(module, {}).values())
