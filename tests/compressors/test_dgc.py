"""DGC's sampled threshold with exact top-k fallback; GMC's approximate top-K."""

from __future__ import annotations

import math
from statistics import NormalDist

import torch
from _sparse_checks import kept_fraction, laplace, sparse_bits

from gradstat.compressors import create
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers.dgc import sampled_threshold


def _spiky(d: int = 10_000, k: int = 10) -> torch.Tensor:
    """k large entries in a sea of small distinct ones (0.009 to 0.011): a small sample usually misses every large
    one, so the sampled threshold (near the sample's maximum) lets a large part of the sea pass. (A sea of equal
    values would be a tie, which the selection resolves as the exact top-k does.)"""
    g = 0.009 + 0.002 * torch.rand(d, generator=torch.Generator().manual_seed(5))
    g[torch.arange(k) * (d // k)] = 5.0
    return g


def test_fallback_takes_the_exact_top_k_when_far_too_many_pass():
    g = _spiky()
    c = create("dgc:ratio=0.001,sample_ratio=0.001")
    payload = c.encode(g, Context(seed=1))
    assert payload.info["passed"] > 10 * 10  # the sampled threshold let far too many through
    out = c.decode(payload, Context(seed=1))
    assert torch.equal(out.nonzero().flatten(), torch.topk(g, 10).indices.sort().values)
    assert payload.bits == sparse_bits(10, 10_000)


def test_without_the_fallback_the_excess_is_sent():
    """The check can fail: a huge fallback factor switches the fallback off and k_hat explodes (a 10-value sample)."""
    out = create("dgc:ratio=0.001,sample_ratio=0.001,fallback=1e9")(_spiky(), Context(seed=1))
    assert kept_fraction(out, 0.001) > 10


def test_dgc_never_sends_more_than_fallback_times_k_on_laplace():
    for seed in range(5):
        g = laplace(50_000, seed)
        out = create("dgc:ratio=0.01,fallback=1.3")(g, Context(seed=seed))
        assert 0 < kept_fraction(out, 0.01) <= 1.3


def test_sampled_threshold_keeps_delta_of_the_sample():
    abs_g = torch.arange(1, 10_001, dtype=torch.float32)
    eta = sampled_threshold(abs_g, ratio=0.1, sample_ratio=1.0, seed=0, replacement=False)
    assert float(eta) == 9001.0  # the whole vector sampled: the exact 1000th largest


def test_gmc_approximate_top_k_selects_about_delta_d_on_average():
    """GMC Sec. 5: |S| = 0.01 d, theta keeps delta |S| of the sample (here 10 of 1000, as 0.001 of the paper's
    larger sample); mean k_hat/k over 40 seeds is n/(n+1) within the 99.9 % z-interval (the order statistic
    gives E[k_hat] = delta d n/(n+1), n = |S|)."""
    g = laplace(100_000, 9)
    c = create("gmc_topk:ratio=0.01")
    q = torch.tensor([kept_fraction(c(g, Context(seed=s)), 0.01) for s in range(40)], dtype=torch.float64)
    expected = 1000 / 1001
    z = (q.mean() - expected) / (q.std() / math.sqrt(q.numel()))
    assert abs(float(z)) < NormalDist().inv_cdf(1 - 0.001 / 2)
    assert float(q.std()) > 0.05  # no fallback: k_hat really varies from draw to draw
