"""Hadamard matrices (Sylvester, Paley I/II over GF(p) and GF(p^2), Kronecker products) and the fast transform."""

from __future__ import annotations

import pytest
import torch

from gradstat.theory.kernels.hadamard import (
    factor,
    first_rows,
    first_rows_transpose,
    fwht,
    hadamard_matrix,
    hadamard_transform,
    is_supported,
)

PAPER_SIZES = [96, 100, 192, 200, 288, 320, 384]  # 000_4b111efa75352b2d.txt Sec. 6
POWERS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
PALEY_BASES = [
    12,
    20,
    24,
    28,
    36,
    44,
    52,
    60,
    72,
    100,
]  # q = 11, 19, 23, 13 (II), 17 (II), 43, 25 (II, GF(5^2)), 59, 71, 49 (II, GF(7^2))


@pytest.mark.parametrize("n", PAPER_SIZES + POWERS + PALEY_BASES)
def test_every_supported_size_is_a_hadamard_matrix(n):
    """H H^T = n I exactly (float64 sums of +-1 are exact integers) and every entry is +-1."""
    h = hadamard_matrix(n, dtype=torch.float64)
    assert h.shape == (n, n)
    assert bool((h.abs() == 1).all())
    assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))


@pytest.mark.parametrize("n", PAPER_SIZES + [8, 64, 12, 100])
def test_fast_transform_equals_the_dense_matrix(n, device):
    h = hadamard_matrix(n, dtype=torch.float64, device=device)
    x = torch.randn(3, 2, n, dtype=torch.float64, device=device, generator=torch.Generator(device).manual_seed(n))
    assert torch.allclose(hadamard_transform(x), x @ h.T, atol=1e-9)
    assert torch.allclose(hadamard_transform(x, transpose=True), x @ h, atol=1e-9)


def test_fwht_is_sylvester_and_an_involution_up_to_n(device):
    n = 256
    x = torch.randn(5, n, dtype=torch.float64, device=device)
    s = hadamard_matrix(n, dtype=torch.float64, device=device)
    assert torch.allclose(fwht(x), x @ s, atol=1e-9)
    assert torch.allclose(fwht(fwht(x)), n * x, atol=1e-9)
    assert fwht(x.float()).dtype == torch.float32


def test_paper_sizes_use_a_small_dense_base():
    """The dense part of the transform is the Paley base only: 96 = 12 x 8, 100 = Paley II over GF(49), ..."""
    assert [factor(n) for n in PAPER_SIZES] == [(12, 8), (100, 1), (12, 16), (100, 2), (36, 8), (20, 16), (12, 32)]


@pytest.mark.parametrize("n", [0, -4, 6, 10, 14, 22])
def test_unsupported_orders_are_rejected_with_a_clear_message(n):
    assert not is_supported(n)
    with pytest.raises(ValueError, match="order"):
        hadamard_matrix(n)


def test_fwht_rejects_a_length_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        fwht(torch.zeros(12))


def test_orthogonality_check_detects_a_wrong_matrix():
    """The check above fails on a matrix with one flipped sign (so it can fail)."""
    h = hadamard_matrix(100, dtype=torch.int64)
    h[3, 7] *= -1
    assert not torch.equal(h @ h.T, 100 * torch.eye(100, dtype=torch.int64))


@pytest.mark.parametrize("n", [8, 64, 96, 100, 192, 200, 288, 320, 384])
@pytest.mark.parametrize("k", [1, 3, 4, 8, 16, 40])
def test_first_rows_and_their_adjoint_equal_the_dense_rows(n, k):
    """The folded k-point path (k a power of two dividing the Sylvester factor) and the general path both give
    ``(H_n x)[:k]`` and ``H_n[:k]^T v``."""
    if k > n:
        pytest.skip("k > n")
    h = hadamard_matrix(n, dtype=torch.float64)
    gen = torch.Generator().manual_seed(n * 100 + k)
    x, v = torch.randn(4, n, generator=gen, dtype=torch.float64), torch.randn(4, k, generator=gen, dtype=torch.float64)
    assert torch.allclose(first_rows(x, k), x @ h[:k].T, atol=1e-9)
    assert torch.allclose(first_rows_transpose(v, n), v @ h[:k], atol=1e-9)


@pytest.mark.parametrize("n", [1, 2, 8, 64, 256, 512, 1024])
def test_fast_fwht_matches_the_butterfly_reference_within_rounding(n):
    from gradstat.theory.kernels.hadamard import fwht, fwht_butterfly

    x = torch.randn(37, n, generator=torch.Generator().manual_seed(n))
    fast, ref = fwht(x), fwht_butterfly(x)
    exact = fwht_butterfly(x.double())
    # both are sums of n terms of |x_i|: compare in units of the float32 rounding of such a sum
    tol = 4 * n * torch.finfo(torch.float32).eps * x.abs().amax(dim=1, keepdim=True)
    assert bool(((fast.double() - exact).abs() <= tol).all())
    assert bool(((ref.double() - exact).abs() <= tol).all())
    assert torch.equal(fwht(torch.eye(n)), fwht_butterfly(torch.eye(n)))  # +-1 entries: exact either way
