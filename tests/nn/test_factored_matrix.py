"""blocklab's FactoredMatrix (blocklab/nn/factored.py) against TransformerLens' own on the same factors,
and against the product A B computed in float64: every operation a circuits notebook uses (svd, U, S,
Vh, norm, eigenvalues, ndim, @ with tensors, vectors and factored matrices on both sides, indexing, T,
scalars, make_even, collapse_l/r, get_corner) and TransformerLens' ``composition_scores`` run on ours.

The singular vectors are fixed only up to a sign (or a rotation where singular values repeat), so
they are compared through what does not depend on that choice: U diag(S) Vh^T = A B, orthonormal
columns, and the Gram matrices of collapse_l / collapse_r."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blocklab.nn.factored import FactoredMatrix

tl = pytest.importorskip("transformer_lens")
from transformer_lens import FactoredMatrix as TheirFactoredMatrix  # noqa: E402
from transformer_lens.utilities import composition_scores  # noqa: E402

ATOL = 1e-10


def _factors(leading: tuple[int, ...], ldim: int, mdim: int, rdim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*leading, ldim, mdim, generator=g, dtype=torch.float64)
    B = torch.randn(*leading, mdim, rdim, generator=g, dtype=torch.float64)
    return A, B


def _three(shape):
    """(ours, TransformerLens', the float64 product) of one drawn shape's factors."""
    A, B = _factors(*shape)
    return FactoredMatrix(A, B), TheirFactoredMatrix(A, B), A @ B


shapes = st.tuples(
    st.lists(st.integers(1, 3), max_size=2).map(tuple),
    st.integers(1, 7),
    st.integers(1, 7),
    st.integers(1, 7),
    st.integers(0, 2**16),
)


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_the_decomposition_is_the_product_and_transformerlens_singular_values(shape) -> None:
    ours, theirs, product = _three(shape)
    assert ours.shape == theirs.shape == product.shape and ours.ndim == theirs.ndim == product.ndim
    U, S, Vh = ours.svd()
    torch.testing.assert_close(S, theirs.S, rtol=0, atol=ATOL * max(1.0, float(S.max())))
    torch.testing.assert_close(U @ torch.diag_embed(S) @ Vh.transpose(-2, -1), product, rtol=0, atol=1e-9)
    eye = torch.eye(S.shape[-1], dtype=torch.float64).expand(*S.shape, S.shape[-1])
    kept = S > 1e-8 * max(1.0, float(S.max()))  # a zero singular value's vectors are free
    for vectors in (U, Vh):
        gram = vectors.transpose(-2, -1) @ vectors
        mask = kept[..., :, None] & kept[..., None, :]
        torch.testing.assert_close(gram[mask], eye[mask], rtol=0, atol=1e-9)
    torch.testing.assert_close(ours.norm(), torch.linalg.matrix_norm(product), rtol=0, atol=1e-9)
    torch.testing.assert_close(ours.norm(), theirs.norm(), rtol=0, atol=1e-9)
    torch.testing.assert_close(ours.make_even().AB, product, rtol=0, atol=1e-9)
    for ours_side, theirs_side in (
        (ours.collapse_l(), theirs.collapse_l()),
        (ours.collapse_r().transpose(-2, -1), theirs.collapse_r().transpose(-2, -1)),
    ):
        torch.testing.assert_close(
            ours_side.transpose(-2, -1) @ ours_side,
            theirs_side.transpose(-2, -1) @ theirs_side,
            rtol=0,
            atol=1e-9,
        )


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_products_on_either_side_are_transformerlens_and_the_float64_product(shape) -> None:
    ours, theirs, product = _three(shape)
    A, B = ours.pair
    _, ldim, _, rdim, seed = shape
    g = torch.Generator().manual_seed(seed + 1)
    right, left = (
        torch.randn(rdim, 5, generator=g, dtype=torch.float64),
        torch.randn(4, ldim, generator=g, dtype=torch.float64),
    )
    column, row = (
        torch.randn(rdim, generator=g, dtype=torch.float64),
        torch.randn(ldim, generator=g, dtype=torch.float64),
    )
    cases = [
        (ours @ right, theirs @ right, product @ right),
        (left @ ours, left @ theirs, left @ product),
        (left @ ours @ right, left @ theirs @ right, left @ product @ right),
        (2.5 * ours, 2.5 * theirs, 2.5 * product),
        (ours.T, theirs.T, product.transpose(-2, -1)),
    ]
    for mine, transformerlens, exact in cases:
        assert isinstance(mine, FactoredMatrix) and mine.shape == transformerlens.shape == exact.shape
        assert mine.mdim == transformerlens.mdim  # the same inner dimension kept
        torch.testing.assert_close(mine.AB, exact, rtol=0, atol=1e-9)
    torch.testing.assert_close(ours @ column, product @ column, rtol=0, atol=1e-9)  # vectors give tensors
    torch.testing.assert_close(row @ ours, (row @ product), rtol=0, atol=1e-9)
    torch.testing.assert_close(ours @ column, theirs @ column, rtol=0, atol=1e-12)
    if ldim == rdim:
        square = FactoredMatrix(B.transpose(-2, -1), A.transpose(-2, -1))  # (.., rdim, ldim)
        torch.testing.assert_close((ours @ square).AB, product @ square.AB, rtol=0, atol=1e-8)
        torch.testing.assert_close(ours.BA, B @ A, rtol=0, atol=0)
        torch.testing.assert_close(ours.eigenvalues, theirs.eigenvalues, rtol=0, atol=1e-9)
    else:
        with pytest.raises(ValueError, match="square"):
            _ = ours.BA


@pytest.mark.parametrize(
    "index",
    [
        (1,),
        (0, 2),
        (0, 2, 3),
        (1, 0, slice(2, 5)),
        (0, 1, 2, 4),
        (1, slice(None), slice(1, 4), slice(0, 2)),
        (slice(None), 2, 5),
    ],
)
def test_indexing_picks_what_transformerlens_picks(index) -> None:
    A, B = _factors((2, 3), 6, 4, 5, seed=3)
    ours, theirs = FactoredMatrix(A, B)[index], TheirFactoredMatrix(A, B)[index]
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours.AB, theirs.AB, rtol=0, atol=0)
    torch.testing.assert_close(FactoredMatrix(A, B).get_corner(2), TheirFactoredMatrix(A, B).get_corner(2))
    with pytest.raises(ValueError, match="too long an index"):
        FactoredMatrix(A, B)[0, 0, 0, 0, 0]


def test_transformerlens_composition_scores_run_on_ours_and_give_its_numbers() -> None:
    A, B = _factors((2, 3), 8, 4, 8, seed=5)
    C, D = _factors((3,), 8, 4, 8, seed=6)
    theirs = composition_scores(TheirFactoredMatrix(A, B), TheirFactoredMatrix(C, D))  # (2, 3, 3)
    torch.testing.assert_close(
        composition_scores(FactoredMatrix(A, B), FactoredMatrix(C, D)), theirs, rtol=0, atol=1e-12
    )
    exact = torch.linalg.matrix_norm((A @ B)[:, :, None] @ (C @ D)[None, None]) / (
        torch.linalg.matrix_norm(A @ B)[:, :, None] * torch.linalg.matrix_norm(C @ D)[None, None]
    )
    torch.testing.assert_close(theirs, exact, rtol=0, atol=1e-12)


def test_factors_that_do_not_chain_or_broadcast_are_refused() -> None:
    with pytest.raises(ValueError, match="do not chain"):
        FactoredMatrix(torch.zeros(3, 4), torch.zeros(5, 3))
    with pytest.raises(ValueError, match="do not broadcast"):
        FactoredMatrix(torch.zeros(2, 3, 4), torch.zeros(3, 4, 3))
    with pytest.raises(ValueError, match="takes a scalar"):
        FactoredMatrix(torch.zeros(3, 4), torch.zeros(4, 3)) * torch.ones(3)


def test_sixteen_bit_factors_are_decomposed_in_float32() -> None:
    A, B = _factors((), 6, 3, 6, seed=7)
    half = FactoredMatrix(A.bfloat16(), B.bfloat16())
    assert half.S.dtype == torch.float32 and half.eigenvalues.dtype == torch.complex64
    torch.testing.assert_close(
        half.S.double(), FactoredMatrix(A.bfloat16().double(), B.bfloat16().double()).S, rtol=1e-5, atol=1e-5
    )
