"""ALiBi, attention with linear biases (Press et al. 2022; BLOOM, MPT, Falcon's alibi option;
docs/concepts.md#alibi): no position code in x0; each head adds to its scores a penalty linear in the
distance between query and key:

    scores[h, i, j] = q_i . k_j / sqrt(d_k) - m_h |i - j|

Causal attention only sees j <= i, where |i - j| = i - j: the paper's -m_h (i - j). BLOOM adds m_h j
instead, which differs from it by m_h i, the same for every key of row i: softmax removes it, so both
give the same weights; the form here keeps the scores themselves (the ``scores`` stage) independent
of where the row sits. Without a causal mask the same formula is the symmetric bias of the encoders
that use ALiBi (MosaicBERT): a key that far away, before or after the query, costs the same.

The slopes m_h, fixed, no parameters: for h heads with h a power of two, m_k = 2^(-8k/h), k = 1..h (a
geometric sequence from 2^(-8/h) down to 2^-8). Otherwise, with n the largest power of two below h, the
n slopes of n heads and then the first h - n of the odd-numbered slopes of 2n heads, 2^(-8k/(2n)) for
k = 1, 3, 5, ... (the paper's reference code, ``get_slopes``).

Distances are counted in each row's own sequence: query t of a forward after ``past`` cached positions
sits at past + t. A left-padded row's real tokens keep their distances (padding keys are masked), so
the row computes what it computes alone.
"""

from __future__ import annotations

import torch
from torch import Tensor


def alibi_slopes(n_heads: int) -> list[float]:
    """The heads' slopes m_1..m_h (module docstring), largest first."""
    if n_heads < 1:
        raise ValueError(f"ALiBi needs n_heads >= 1, got {n_heads}")
    n = 1 << (n_heads.bit_length() - 1)  # the largest power of two <= n_heads
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    return slopes + [2.0 ** (-8.0 * k / (2 * n)) for k in range(1, 2 * (n_heads - n), 2)]


def alibi_bias(slopes: Tensor, T: int, past: int = 0) -> Tensor:
    """-m_h |i - j| for the T queries at positions past..past+T-1 and the past + T keys: (h, T, past + T),
    in the slopes' dtype and device."""
    i = torch.arange(past, past + T, device=slopes.device)
    j = torch.arange(past + T, device=slopes.device)
    distance = (i[:, None] - j[None, :]).abs().to(slopes.dtype)  # (T, past + T)
    return -slopes[:, None, None] * distance


def check_alibi_positions(position_ids: Tensor, padding: Tensor | None) -> None:
    """ALiBi reads distances in each row, not position ids: ids that step by one along a row's real
    tokens (``padding`` (B, T): True at padding) give the same distances; other ids are refused."""
    steps = position_ids[:, 1:] - position_ids[:, :-1]
    real = torch.ones_like(steps, dtype=torch.bool) if padding is None \
        else ~(padding[:, 1:] | padding[:, :-1])
    if bool((steps[real] != 1).any()):
        raise ValueError("position_ids must count up by one along each row's real tokens with "
                         "pos_encoding='alibi': its bias reads the distance between tokens in the row")
