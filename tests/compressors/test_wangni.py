"""Wangni et al. unbiased sparsification: optimal probabilities (against theory/'s numpy closed form), variance,
bits."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch
from _sparse_checks import laplace, sparse_bits

import gradstat.theory.wangni
from gradstat.compressors import create
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers.wangni import optimal_probabilities


@pytest.mark.parametrize("k", [1, 10, 100, 999])
def test_probabilities_match_the_closed_form_of_theory(k):
    g = laplace(1000, k)
    p = optimal_probabilities(g.abs().double(), k)
    reference, _ = gradstat.theory.wangni.optimal_probabilities(g.double().numpy(), k / 1000)
    np.testing.assert_allclose(p.numpy(), reference, rtol=1e-9, atol=1e-12)
    assert float(p.sum()) == pytest.approx(k, rel=1e-9)


def test_probabilities_saturate_the_dominant_coordinates_and_skip_zeros():
    p = optimal_probabilities(torch.tensor([100.0, 1, 1, 1, 1, 0, 0]), 3)
    assert p.tolist() == pytest.approx([1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0])
    assert optimal_probabilities(torch.tensor([0.0, 2.0, 0.0]), 2).tolist() == [0.0, 1.0, 0.0]


def test_variance_equals_the_closed_form():
    """E||C(g) - g||^2 = sum g_i^2 (1/p_i - 1) (gradstat.theory.wangni.variance); 99.9 % z-interval over 3000 draws.
    A variant sending g_i instead of g_i/p_i fails it."""
    g = laplace(300, 5)
    c = create("wangni:ratio=0.05")
    p = optimal_probabilities(g.abs().double(), math.ceil(0.05 * 300)).numpy()
    expected = gradstat.theory.wangni.variance(g.double().numpy(), p)
    outs = [c(g, Context(seed=s)).double() for s in range(3000)]
    crit = NormalDist().inv_cdf(1 - 0.001 / 2)
    for reconstruction, should_pass in ((lambda out: out, True), (lambda out: (out != 0) * g.double(), False)):
        err = torch.tensor([float(((reconstruction(out) - g.double()) ** 2).sum()) for out in outs])
        z = (err.mean() - expected) / (err.std() / math.sqrt(err.numel()))
        assert (abs(float(z)) < crit) == should_pass


def test_expected_count_is_k_and_bits_are_values_plus_indices():
    g = laplace(2000, 6)
    c = create("wangni:ratio=0.01")
    counts = []
    for s in range(400):
        payload = c.encode(g, Context(seed=s))
        k_hat = payload["values"].numel()
        assert payload.bits == sparse_bits(k_hat, 2000)
        counts.append(k_hat)
    counts = torch.tensor(counts, dtype=torch.float64)
    z = (counts.mean() - 20) / (counts.std() / math.sqrt(400))  # sum p_i = k = 20
    assert abs(float(z)) < NormalDist().inv_cdf(1 - 0.001 / 2)
