"""QSGD: s levels, l2 scale per bucket (Alistarh et al. 2017; 002_87c17e3716ede1d0.txt Lemma 2)."""

from __future__ import annotations

import math

import pytest
import torch
from _quant_checks import check_mean_at_most, check_mean_equals, check_unbiased, draws, laplace, relative_errors

from gradstat.compressors import Context, create
from gradstat.compressors.schemes.quantizers.qsgd import QSGD
from gradstat.theory.qsgd import variance_bound


@pytest.mark.parametrize(
    "d,s,bucket,expected",
    [
        (1000, 4, 512, 1000 * 4 + 2 * 32),  # codes in {-4..4}: ceil(log2 9) = 4 bits; 2 buckets
        (1000, 1, 0, 1000 * 2 + 32),  # ternary codes, one scale
        (7, 2, 3, 7 * 3 + 3 * 32),  # 5 levels -> 3 bits; buckets of 3, 3, 1
    ],
)
def test_bits_are_codes_plus_one_scale_per_bucket_and_no_seed(d, s, bucket, expected):
    p = QSGD(s=s, bucket=bucket).encode(torch.randn(d))
    assert p.bits == expected and "seed" not in p.parts


def test_levels_follow_the_stochastic_rounding_probabilities():
    """Eq. (1) of 002_87c17e3716ede1d0.txt: |x|/||g|| in [l/s, (l+1)/s] goes up with probability s|x|/||g|| - l
    (99.9 % z-test over 4000 draws)."""
    g = torch.tensor([3.0, -4.0, 0.0])  # ||g|| = 5: |x| = 0.6, 0.8, 0
    out = draws(QSGD(s=2, bucket=0), g, 4000)
    up0 = (out[:, 0] > 2.5 + 1e-6).double()  # 0.6 = 1/2 + 0.1: level 1 w.p. 0.8
    assert set(out[:, 0].tolist()) <= {2.5, 5.0} and set(out[:, 2].tolist()) == {0.0}
    assert check_mean_equals(up0, 0.2) == []
    assert set(out[:, 1].tolist()) <= {-2.5, -5.0}
    assert check_mean_equals((out[:, 1] < -2.5 - 1e-6).double(), 0.6) == []


def test_qsgd_is_unbiased():
    assert check_unbiased(QSGD(s=2, bucket=256), laplace(1024, 1), trials=400) == []


@pytest.mark.parametrize("s,bucket", [(1, 256), (4, 512), (16, 0)])
def test_variance_within_min_n_over_s2_sqrt_n_over_s(s, bucket):
    """E||Q(g) - g||^2 / ||g||^2 <= min(n/s^2, sqrt(n)/s), n = bucket length (99.9 % one-sided)."""
    g = laplace(2048, 2)
    n = bucket or g.numel()
    errs = relative_errors(QSGD(s=s, bucket=bucket), g, 200)
    assert check_mean_at_most(errs, variance_bound(n, s)) == []


def test_exact_conditional_variance_matches_monte_carlo():
    g = laplace(1500, 3)
    c = QSGD(s=3, bucket=500)
    errs = ((draws(c, g, 300) - g.double()) ** 2).sum(1)
    assert check_mean_equals(errs, float(c.expected_error(g))) == []


def test_a_seeded_decoder_needs_no_dither():
    g = laplace(1000, 4)
    p = QSGD().encode(g, Context(seed=1))
    assert torch.equal(QSGD().decode(p, Context(seed=999)), create("qsgd").decode(p, Context(seed=1)))


@pytest.mark.parametrize("spec,msg", [("qsgd:s=0", "qsgd s"), ("qsgd:bucket=-1", "qsgd bucket")])
def test_bad_parameters_are_rejected(spec, msg):
    with pytest.raises(ValueError, match=msg):
        create(spec)


def test_variance_check_detects_a_wrong_scale():
    """A QSGD whose codes are decoded at twice the scale violates the bound check (so the check can fail)."""

    class Doubled(QSGD):
        def _decode(self, payload, ctx, side):
            return 2 * super()._decode(payload, ctx, side)

    g = laplace(2048, 2)
    assert check_mean_at_most(relative_errors(Doubled(s=16, bucket=0), g, 50), variance_bound(2048, 16)) != []
    assert math.isfinite(variance_bound(2048, 16))


def test_bits_match_the_theory_count():
    from gradstat.theory.bits import qsgd_bits

    assert QSGD(s=4, bucket=512).encode(torch.randn(512)).bits == qsgd_bits(512, 4)
