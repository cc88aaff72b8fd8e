"""Measurement building blocks: goodness of fit, relative error and bias samples, bounds map, replay metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradstat import compressors
from gradstat.analysis.studies.bounds import closed_form_bound
from gradstat.analysis.studies.fits import fit_vector, goodness_of_fit
from gradstat.analysis.studies.variance import bias_samples, error_samples, variance_table


def test_ks_statistic_matches_scipy():
    from scipy import stats

    x = np.sort(np.random.default_rng(1).exponential(2.0, 500))
    ks, _ = goodness_of_fit(x, lambda v: stats.expon.cdf(v, scale=2.0))
    assert ks == pytest.approx(stats.kstest(x, stats.expon(scale=2.0).cdf).statistic, rel=1e-12)


def test_anderson_darling_has_mean_one_under_the_null():
    """E[A^2] = 1 for a fully specified continuous null (Anderson & Darling 1954). 300 samples of n = 100 uniforms:
    the sd of A^2 is about 0.8, so the mean's sd is 0.046 and |mean - 1| < 0.15 is a > 3-sigma band; a wrong sign or
    a missing term shifts the mean by O(n)."""
    rng = np.random.default_rng(2)
    a2 = [goodness_of_fit(np.sort(rng.random(100)), lambda v: v)[1] for _ in range(300)]
    assert abs(np.mean(a2) - 1.0) < 0.15


def test_fit_vector_ranks_the_true_family_first_and_tail_check_near_one():
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(200_000, generator=gen, dtype=torch.float64) - 0.5
    g = -torch.sign(u) * torch.log1p(-2 * u.abs()) * 0.01  # Laplace(0, 0.01)
    rows = {(r["family"], r["method"]): r for r in fit_vector(g, methods=("mle",))}
    exp = rows[("exponential", "mle")]
    assert exp["scale"] == pytest.approx(0.01, rel=0.01)
    assert exp["aic"] <= min(r["aic"] for r in rows.values()) + 4  # the extra shape parameter buys < 2 log-lik
    assert exp["tail_0.01"] == pytest.approx(1.0, abs=0.1)  # binomial sd of k_hat/k at d delta = 2000: 0.022
    assert exp["zero_fraction"] == 0.0 and exp["gof_n"] == 20_000


def test_fit_vector_rejects_empty_and_zero_vectors():
    with pytest.raises(ValueError, match="empty"):
        fit_vector(torch.zeros(0))
    with pytest.raises(ValueError, match="nonzero"):
        fit_vector(torch.zeros(10))


def test_relative_error_of_randk_is_one_minus_density_in_expectation():
    g = torch.randn(400, generator=torch.Generator().manual_seed(0))
    x = error_samples(compressors.create("randk:ratio=0.25"), g, 400)
    assert x.mean() == pytest.approx(0.75, abs=4 * x.std() / 20)


def test_bias_of_a_sparsifier_is_minus_its_error():
    g = torch.randn(300, generator=torch.Generator().manual_seed(0))
    comp = compressors.create("topk:ratio=0.1")
    assert bias_samples(comp, g, 3) == pytest.approx(-error_samples(comp, g, 3))


def test_error_samples_reject_zero_vectors():
    with pytest.raises(ValueError, match="all zeros"):
        error_samples(compressors.create("topk:ratio=0.1"), torch.zeros(100), 3)


def test_bounds_map_reads_theory():
    from gradstat.theory.qcs import gamma

    g = torch.randn(1024, generator=torch.Generator().manual_seed(0))
    b = closed_form_bound(compressors.create("qcs:block=256,k=32,Q=2"), g)
    assert b.value == gamma(256, 32, 2) and b.claim == "upper"
    b = closed_form_bound(compressors.create("topk:ratio=0.1"), g)
    assert b.value == pytest.approx(1 - math.ceil(102.4) / 1024)
    b = closed_form_bound(compressors.create("dqsg:M=2"), g)
    assert b.claim == "equal" and b.value == pytest.approx(
        float(g.abs().max()) ** 2 * 1024 / 48 / float(g.square().sum())
    )


def test_variance_table_gives_a_verdict_per_compressor():
    g = torch.randn(512, generator=torch.Generator().manual_seed(0))
    df = variance_table(["dqsg:M=2", "qsgd:s=2,bucket=512"], [("g", g)], trials=100)
    assert list(df["verdict"]) == ["holds", "holds"]
    assert (df["ci_low"] <= df["empirical"]).all() and (df["empirical"] <= df["ci_high"]).all()
