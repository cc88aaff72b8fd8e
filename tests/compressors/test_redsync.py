"""RedSync: bisection between mean and max of |g|, moving the right way; the authors' variant moves the wrong way."""

from __future__ import annotations

import math

import torch
from _sparse_checks import kept_fraction, laplace

from gradstat.compressors import create
from gradstat.compressors.context import Context


def authors_redsync_threshold(abs_g: torch.Tensor, k: int, eps: float = 0.2) -> float:
    """The SIDCo authors' RedSync baseline search, as they wrote it (a wrong-direction branch: when
    k/2 <= nnz <= k it raises the threshold although too few are selected already)."""
    left, right = 0.0, 1.0
    mean, top = float(abs_g.mean()), float(abs_g.max())
    thres = 0.0
    while right - left > eps:
        mid = left + (right - left) / 2
        thres = mean + mid * (top - mean)
        nnz = int((abs_g > thres).sum())
        if k < nnz < 2 * k:
            break
        elif nnz < k / 2:
            right = mid
        else:
            left = mid
    return thres


def test_redsync_selects_between_k_and_2k_on_laplace():
    for seed, ratio in [(1, 0.01), (2, 0.001), (3, 0.05)]:
        g = laplace(200_000, seed)
        out = create(f"redsync:ratio={ratio}")(g, Context())
        assert 1.0 <= kept_fraction(out, ratio) <= 2.0


def test_the_authors_search_misses_the_band_where_the_fixed_one_hits_it():
    """The check can fail: on a vector where the count crosses (k/2, k) the authors' search ends outside
    [k, 2k] while RedSync here ends inside."""
    abs_g = torch.linspace(0, 1, 100_001)[1:] ** 8  # counts fall smoothly from d to 0 between mean and max
    k = 12_000
    theirs = int((abs_g > authors_redsync_threshold(abs_g, k)).sum())
    ours = kept_fraction(create("redsync:ratio=0.12")(abs_g, Context()), 0.12)
    assert not (k <= theirs <= 2 * k)
    assert 1.0 <= ours <= 2.0


def test_redsync_on_constant_input_terminates_and_keeps_k_as_topk_does():
    """A constant vector is all ties: the search ends, and the tie-break keeps k = 10 coordinates (index order)."""
    out = create("redsync:ratio=0.01")(torch.full((1000,), -0.3), Context())
    expected = torch.zeros(1000)
    expected[:10] = -0.3
    assert torch.equal(out, expected)


def test_redsync_bits_are_k_hat_values_and_indices():
    g = laplace(4096, 5)
    payload = create("redsync:ratio=0.01").encode(g)
    k_hat = payload["values"].numel()
    assert payload.bits == k_hat * (32 + math.ceil(math.log2(4096)))
