"""A matrix product A B kept as its two factors (TransformerLens' ``FactoredMatrix``, Elhage et al. 2021).

A head's circuits are low rank: QK = W_Q W_K^T and OV = W_V W_O are (d, d) matrices of rank d_head. Kept
as A (..., ldim, mdim) and B (..., mdim, rdim) they cost 2 d d_head numbers instead of d^2, and most of
what one asks of them can be answered from the factors:

- the singular value decomposition from two thin SVDs and one (mdim, mdim) SVD:
  A = Ua Sa Va^T, B = Ub Sb Vb^T, so A B = Ua (Sa Va^T Ub Sb) Vb^T = Ua (Um Sm Vm^T) Vb^T;
  U = Ua Um, S = Sm, and V = Vb Vm. As in TransformerLens, ``Vh`` is V itself (..., rdim, k), not its
  transpose: A B = U diag(S) Vh^T.
- the nonzero eigenvalues from B A (mdim, mdim): if B A v = k v then A B (A v) = k (A v).
- the Frobenius norm from the singular values.

Leading dimensions (layer, head) broadcast; ``fm[l, h]`` indexes them, and one or two more indices pick
rows, then columns. ``@`` works with tensors (vectors give vectors) and factored matrices on either side,
keeping the smaller inner dimension. 16-bit factors are decomposed in float32 (torch's CPU SVD and
eigen-solvers have no 16-bit kernels); the decomposition is then float32.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch
from torch import Tensor

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def _decomposable(t: Tensor) -> Tensor:
    return t.float() if t.dtype in _SIXTEEN_BIT else t


class FactoredMatrix:
    """A B kept as its factors: A (..., ldim, mdim), B (..., mdim, rdim); the leading dims broadcast."""

    def __init__(self, A: Tensor, B: Tensor) -> None:
        if A.ndim < 2 or B.ndim < 2 or A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"factors do not chain: A {tuple(A.shape)}, B {tuple(B.shape)} "
                "(A's last dimension must equal B's second to last)"
            )
        try:
            leading = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError as error:
            raise ValueError(
                f"the factors' leading dimensions do not broadcast: A {tuple(A.shape)}, B {tuple(B.shape)}"
            ) from error
        self.ldim, self.mdim, self.rdim = A.shape[-2], A.shape[-1], B.shape[-1]
        self.A = A.broadcast_to((*leading, self.ldim, self.mdim))
        self.B = B.broadcast_to((*leading, self.mdim, self.rdim))
        self.has_leading_dims = len(leading) > 0

    # -- shape ---------------------------------------------------------------------------------

    @property
    def shape(self) -> torch.Size:
        return torch.Size([*self.A.shape[:-1], self.rdim])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def size(self, dim: int) -> int:
        return self.shape[dim]

    def unsqueeze(self, dim: int) -> FactoredMatrix:
        """A new leading dimension of size 1 at ``dim`` (of the leading dimensions: counted as in
        ``Tensor.unsqueeze`` on A and B, so ``dim`` must not reach the last two)."""
        return FactoredMatrix(self.A.unsqueeze(dim), self.B.unsqueeze(dim))

    @property
    def pair(self) -> tuple[Tensor, Tensor]:
        return self.A, self.B

    # -- products ------------------------------------------------------------------------------

    @property
    def AB(self) -> Tensor:  # (..., ldim, rdim)
        return self.A @ self.B

    @property
    def BA(self) -> Tensor:  # (..., mdim, mdim): the same nonzero eigenvalues, a smaller matrix
        if self.ldim != self.rdim:
            raise ValueError(f"B A needs a square product; this one is {tuple(self.shape)}")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    def __matmul__(self, other: Tensor | FactoredMatrix) -> Tensor | FactoredMatrix:
        if isinstance(other, FactoredMatrix):
            return (self @ other.A) @ other.B
        if other.ndim == 1:  # (rdim,) -> (..., ldim)
            return (self.A @ (self.B @ other[:, None]))[..., 0]  # a column, so leading dims broadcast
        if other.shape[-2] != self.rdim:
            raise ValueError(f"cannot multiply {tuple(self.shape)} by {tuple(other.shape)}")
        if self.mdim < self.rdim:  # fold other into B: the inner dimension stays mdim
            return FactoredMatrix(self.A, self.B @ other)
        return FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: Tensor) -> Tensor | FactoredMatrix:
        if other.shape[-1] != self.ldim:
            raise ValueError(f"cannot multiply {tuple(other.shape)} by {tuple(self.shape)}")
        if other.ndim == 1:  # (ldim,) -> (..., rdim)
            return ((other[None, :] @ self.A) @ self.B)[..., 0, :]
        if self.mdim < self.ldim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.AB)

    def __mul__(self, scalar: float | Tensor) -> FactoredMatrix:
        if isinstance(scalar, Tensor) and scalar.numel() != 1:
            raise ValueError(
                f"* takes a scalar; got a tensor of shape {tuple(scalar.shape)} (use @ for a matrix product)"
            )
        return FactoredMatrix(self.A * scalar, self.B)

    __rmul__ = __mul__

    # -- decompositions ------------------------------------------------------------------------

    @cached_property
    def _svd(self) -> tuple[Tensor, Tensor, Tensor]:
        Ua, Sa, Vah = torch.linalg.svd(_decomposable(self.A), full_matrices=False)  # Vah = Va^T
        Ub, Sb, Vbh = torch.linalg.svd(_decomposable(self.B), full_matrices=False)
        middle = Sa[..., :, None] * (Vah @ Ub) * Sb[..., None, :]  # (..., ka, kb)
        Um, Sm, Vmh = torch.linalg.svd(middle, full_matrices=False)
        return Ua @ Um, Sm, Vbh.transpose(-2, -1) @ Vmh.transpose(-2, -1)

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """(U, S, Vh) with A B = U diag(S) Vh^T; Vh is (..., rdim, k) as in TransformerLens."""
        return self._svd

    @property
    def U(self) -> Tensor:  # (..., ldim, k)
        return self._svd[0]

    @property
    def S(self) -> Tensor:  # (..., k), descending
        return self._svd[1]

    @property
    def Vh(self) -> Tensor:  # (..., rdim, k)
        return self._svd[2]

    @property
    def eigenvalues(self) -> Tensor:
        """The eigenvalues of B A (..., mdim), complex: those of A B that can be nonzero."""
        return torch.linalg.eigvals(_decomposable(self.BA))

    def norm(self) -> Tensor:
        """The Frobenius norm of A B (...,): the root of the sum of the squared singular values."""
        return self.S.pow(2).sum(-1).sqrt()

    def make_even(self) -> FactoredMatrix:
        """The same product as U sqrt(S) times sqrt(S) Vh^T: each factor carries half of every singular
        value, with orthogonal columns (rows)."""
        root = self.S.sqrt()
        return FactoredMatrix(self.U * root[..., None, :], root[..., :, None] * self.Vh.transpose(-2, -1))

    def collapse_l(self) -> Tensor:
        """diag(S) Vh^T (..., k, rdim): the product without its left orthogonal factor."""
        return self.S[..., :, None] * self.Vh.transpose(-2, -1)

    def collapse_r(self) -> Tensor:
        """U diag(S) (..., ldim, k): the product without its right orthogonal factor."""
        return self.U * self.S[..., None, :]

    def get_corner(self, k: int = 3) -> Tensor:
        """The first k entries along every dimension of A B, computed from k rows and k columns only."""
        corner = self.A[..., :k, :] @ self.B[..., :, :k]
        return corner[tuple(slice(k) for _ in range(corner.ndim))]

    # -- indexing ------------------------------------------------------------------------------

    def __getitem__(self, index: Any) -> FactoredMatrix:
        """``fm[l, h]`` indexes the leading dimensions; one more index picks rows, two pick rows and
        columns (an integer keeps its dimension, as a slice of one, so the result stays a matrix)."""
        index = index if isinstance(index, tuple) else (index,)
        given = [i for i in index if i is not None]
        leading = self.ndim - 2
        if len(given) > self.ndim:
            raise ValueError(
                f"{index} is too long an index for a factored matrix of shape {tuple(self.shape)}"
            )
        if len(given) <= leading:
            return FactoredMatrix(self.A[index], self.B[index])

        def kept(i: Any) -> Any:  # a row or column index keeps its dimension
            return slice(i, i + 1) if isinstance(i, int) else i

        if len(given) == leading + 1:  # rows: A's rows only
            return FactoredMatrix(self.A[(*index[:-1], kept(index[-1]))], self.B[index[:-1]])
        head, rows, cols = index[:-2], kept(index[-2]), kept(index[-1])
        return FactoredMatrix(self.A[(*head, rows)], self.B[(*head, slice(None), cols)])

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner dimension {self.mdim})"
