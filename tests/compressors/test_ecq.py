"""ECQ-SGD's quantizer (003_da514025a9ec0a1c.txt) and its error compensation (ErrorFeedback.ecq)."""

from __future__ import annotations

import math

import pytest
import torch
from _quant_checks import check_mean_at_most, check_unbiased, laplace, relative_errors

from gradstat.compressors import Context, ErrorFeedback, create
from gradstat.compressors.schemes.quantizers.ecq import ECQ
from gradstat.theory.qsgd import variance_bound


@pytest.mark.parametrize("s,width", [(4, 4), (1, 2), (2, 3), (7, 4), (8, 5)])
def test_bits_are_32_plus_d_ceil_log2_2s_plus_1(s, width):
    assert ECQ(s=s).encode(torch.randn(1000)).bits == 32 + 1000 * width == 32 + 1000 * math.ceil(math.log2(2 * s + 1))


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_quantizer_is_unbiased(norm):
    assert check_unbiased(ECQ(s=4, norm=norm), laplace(1024, 7), trials=300) == []


def test_l2_scale_within_the_qsgd_bound_and_linf_is_finer():
    g = laplace(2048, 8)
    l2 = relative_errors(ECQ(s=4, norm="l2"), g, 100)
    linf = relative_errors(ECQ(s=4, norm="linf"), g, 100)
    assert check_mean_at_most(l2, variance_bound(2048, 4)) == []
    assert float(linf.mean()) < float(l2.mean())
    assert ECQ(norm="linf").properties.bound == "half_dither_linf"


def _ecq_sgd(compressor, g, steps, alpha, beta):
    """ECQ-SGD as written in 003_da514025a9ec0a1c.txt: h_t = beta h_{t-1} + (g_{t-1} - g~_{t-1}),
    g~_t = Q(g_t + alpha h_t), h_0 = 0. Returns the average of what was sent and the last h."""
    h, total = torch.zeros_like(g), torch.zeros_like(g)
    for t in range(steps):
        sent = compressor(g + alpha * h, Context(seed=t))
        h = beta * h + (g - sent)
        total += sent
    return total / steps, h


def test_error_compensation_tracks_a_constant_gradient_closer_than_no_compensation():
    """With alpha = beta = 1 what is sent over T steps sums to T g minus the last h: the average error is O(1/T),
    against O(1/sqrt(T)) for the same quantizer without compensation (alpha = 0)."""
    g = laplace(512, 9)
    q = ECQ(s=4, norm="linf")
    compensated, _ = _ecq_sgd(q, g, 200, alpha=1.0, beta=1.0)
    plain, _ = _ecq_sgd(q, g, 200, alpha=0.0, beta=0.0)
    assert float((compensated - g).norm()) < 0.2 * float((plain - g).norm())


def test_feedback_ecq_follows_the_papers_recursion():
    g = laplace(256, 10)
    q = ECQ(s=2, norm="linf")
    alpha, beta = 0.5, 0.9
    _, h_paper = _ecq_sgd(q, g, 3, alpha, beta)
    fb = ErrorFeedback.ecq(alpha, beta)
    state = fb.new_state()
    for t in range(3):
        z = fb.compensate(g, state)
        fb.update(z, q(z, Context(seed=t)), state)
    assert torch.allclose(state.residual, h_paper, atol=1e-4)


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="ecq s"):
        create("ecq:s=0")
    with pytest.raises(ValueError, match="not one of"):
        create("ecq:norm=l1")
