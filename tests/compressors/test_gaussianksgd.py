"""GaussianKSGD: Gaussian fit, then adjustment towards [2/3 k, 4/3 k], on |g| (both signs), bounded."""

from __future__ import annotations

import torch
from _sparse_checks import kept_fraction, laplace

from gradstat.compressors import create
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers.threshold import search_threshold


def test_gaussian_start_is_the_two_sided_normal_quantile():
    """On Gaussian data the first threshold already selects about delta d (no adjustment needed)."""
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(200_000, generator=gen)
    payload = create("gaussianksgd:ratio=0.01,max_iter=1").encode(g)
    assert 0.9 <= payload.info["k_hat"] / 2000 <= 1.1


def test_adjustment_brings_laplace_into_the_band():
    g = laplace(200_000, 4)
    once = create("gaussianksgd:ratio=0.001,max_iter=1").encode(g).info["k_hat"] / 200
    adjusted = kept_fraction(create("gaussianksgd:ratio=0.001,max_iter=10")(g, Context()), 0.001)
    assert not (2 / 3 <= once <= 4 / 3)  # the Gaussian fit alone misses a Laplace tail
    assert 2 / 3 <= adjusted <= 4 / 3


def test_selection_is_on_magnitudes_so_negative_gradients_are_kept():
    """A positive-only selection (one of the authors' baseline bugs) would send nothing here."""
    g = -laplace(100_000, 5).abs()
    out = create("gaussianksgd:ratio=0.01,max_iter=10")(g, Context())
    assert 2 / 3 <= kept_fraction(out, 0.01) <= 4 / 3
    assert bool((out <= 0).all())


def test_all_zero_gradient_terminates_with_nothing_sent():
    payload = create("gaussianksgd").encode(torch.zeros(5000))
    assert payload.bits == 0 and payload.info["k_hat"] == 0
    # the search itself stops at once on all-zero magnitudes (threshold 0 can only select zeros, never sent)
    eta, steps = search_threshold(torch.zeros(5000), 50, torch.zeros(()), (0.8, 1.2), max_iter=40)
    assert steps == 1 and float(eta) == 0.0
