"""Random-k: seeded indices (values and a seed only on the wire), exact expected error, unbiased scaling."""

from __future__ import annotations

import math
from statistics import NormalDist

import torch
from _sparse_checks import laplace

from gradstat.compressors import create
from gradstat.compressors.context import SEED_BITS, Context
from gradstat.compressors.schemes.sparsifiers.randk import random_subset


def test_bits_are_k_float32_values_and_one_seed():
    payload = create("randk:ratio=0.01").encode(laplace(1000, 1))
    assert payload.bits == 10 * 32 + SEED_BITS == 384
    assert "indices" not in payload.parts


def test_random_subset_is_distinct_seeded_and_device_local(device):
    a = random_subset(1000, 50, seed=7, device=device)
    assert a.device.type == device.type and a.unique().numel() == 50
    assert torch.equal(a, random_subset(1000, 50, seed=7, device=device))
    assert not torch.equal(a, random_subset(1000, 50, seed=8, device=device))


def test_the_decoder_places_the_values_where_the_encoder_took_them():
    g = laplace(500, 2)
    c = create("randk:ratio=0.1")
    out = c(g, Context(seed=3, step=9))
    kept = out != 0
    assert int(kept.sum()) == 50 and torch.equal(out[kept], g[kept])


def test_expected_error_is_one_minus_k_over_d():
    """E||C(g) - g||^2 = (1 - k/d) ||g||^2 exactly; 99.9 % two-sided z-interval over 2000 draws."""
    g = laplace(200, 3)
    c = create("randk:ratio=0.1")
    err = torch.tensor([float(((c(g, Context(seed=s)) - g) ** 2).sum()) for s in range(2000)], dtype=torch.float64)
    err /= float((g.double() ** 2).sum())
    z = (err.mean() - (1 - 20 / 200)) / (err.std() / math.sqrt(err.numel()))
    assert abs(float(z)) < NormalDist().inv_cdf(1 - 0.001 / 2)


def test_unbiased_variant_scales_by_d_over_k_and_has_the_wangni_variance():
    """E||C(g) - g||^2 = (d/k - 1) ||g||^2 for uniform p = k/d; 99.9 % z-interval over 2000 draws. The unscaled
    variant (expected error 1 - k/d = 0.9) fails the same check."""
    g = laplace(200, 4)
    energy = float((g.double() ** 2).sum())
    for name, expected, should_pass in (("randk_unbiased", 200 / 20 - 1, True), ("randk", 200 / 20 - 1, False)):
        c = create(f"{name}:ratio=0.1")
        err = torch.tensor(
            [float(((c(g, Context(seed=s)) - g) ** 2).sum()) / energy for s in range(2000)], dtype=torch.float64
        )
        z = (err.mean() - expected) / (err.std() / math.sqrt(err.numel()))
        assert (abs(float(z)) < NormalDist().inv_cdf(1 - 0.001 / 2)) == should_pass
