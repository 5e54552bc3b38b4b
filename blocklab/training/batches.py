"""Which training examples each step reads: an endless sequence of per-epoch permutations, a pure function
of (seed, step), so that a resumed run reads the batches the uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import torch
from torch import Tensor


@lru_cache(maxsize=8)
def epoch_order(seed: int, epoch: int, n: int) -> Tensor:
    """The permutation of the ``n`` training examples used in ``epoch``."""
    # torch's CPU generator keeps 32 bits of its seed, so (seed, epoch) is hashed down to 32 bits
    mixed = int.from_bytes(hashlib.sha256(f"{seed}/{epoch}".encode()).digest()[:4], "little")
    return torch.randperm(n, generator=torch.Generator().manual_seed(mixed))


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> Tensor:
    """Training-example indices of global batch ``step`` (1-based): the next ``batch_size`` items of
    the endless sequence epoch 0's permutation, epoch 1's, ... A pure function of its arguments."""
    flat = torch.arange((step - 1) * batch_size, step * batch_size)
    epochs, offsets = flat // n, flat % n
    out = torch.empty(batch_size, dtype=torch.long)
    for epoch in epochs.unique().tolist():
        where = epochs == epoch
        out[where] = epoch_order(seed, epoch, n)[offsets[where]]
    return out
