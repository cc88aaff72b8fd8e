"""Convergence terms: QCS Lemma 5/6, (22), (23) (000_4b111efa75352b2d.txt); DQSG Theorem 5, (5) (002)."""

from __future__ import annotations

import math

import pytest

from gradstat.theory import convergence as cv


def test_lemma5_variants_coincide_without_compression_error():
    args = dict(f_gap=3.0, smoothness=2.0, step=0.1, gamma=0.0, grad_bound=4.0, iterations=100)
    assert cv.qcs_average_gradient_bound(**args) == cv.qcs_average_gradient_bound(**args, mmse=True)
    assert cv.qcs_average_gradient_bound(**args) == pytest.approx(3 / 10 + 1.0 * 0.1 * 4)


def test_22_is_lemma5_with_step_one_over_sqrt_t():
    f, L, g, B, T = 3.0, 2.0, 1.5, 4.0, 400
    lemma5 = cv.qcs_average_gradient_bound(f, L, 1 / math.sqrt(T), g, B, T)
    assert cv.qcs_rate_no_feedback(f, L, g, B, T) == pytest.approx(lemma5, rel=1e-12)


def test_lemma6_and_23_values():
    assert cv.qcs_average_gradient_bound_feedback(3.0, 2.0, 0.1, 5.0, 4.0, 100) == pytest.approx(
        3 / 5 + 2 * 4 * (0.1 + 4 * 2 * 5 * 0.01)
    )
    eps, T = 0.21, 100  # sqrt(1 + eps) = 1.1
    expected = (3 + 1.0 * 4 * 1.21) / 10 + 4 * 4 * 1.21**2 / 0.1 * 5 / 100
    assert cv.qcs_rate_feedback(3.0, 2.0, 4.0, eps, 5.0, T) == pytest.approx(expected)
    assert cv.qcs_rate_feedback(3.0, 2.0, 4.0, eps, math.inf, T) == math.inf


def test_time_increase_5_is_the_ratio_of_theorem5_iteration_counts():
    n, delta, V, B = 1000, 0.05, 2.0, 3.0
    quantized = cv.dqsg_iterations(1.5, cv.dqsg_variance(n, delta, V, B), 0.01, 8)
    baseline = cv.dqsg_iterations(1.5, V, 0.01, 8)  # no quantization: sigma^2 = V
    assert quantized / baseline - 1 == pytest.approx(cv.dqsg_time_increase(n, delta, B, V), rel=1e-12)


def test_theorem5_step_size():
    assert cv.dqsg_step_size(0.1, 1.0, 2.0, 4) == pytest.approx(0.1 / (1 + 0.55))
    with pytest.raises(ValueError, match="smoothness"):
        cv.dqsg_step_size(0.1, 0.0, 0.0, 4)


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: cv.qcs_average_gradient_bound(1.0, 1.0, 0.0, 1.0, 1.0, 10), "step"),
        (lambda: cv.qcs_rate_no_feedback(-1.0, 1.0, 1.0, 1.0, 10), "f_gap"),
        (lambda: cv.qcs_rate_feedback(1.0, 1.0, 1.0, 0.0, 1.0, 10), "eps"),
        (lambda: cv.dqsg_iterations(1.0, 1.0, 0.1, 0), "workers"),
        (lambda: cv.dqsg_time_increase(10, 0.1, 1.0, 0.0), "sg_variance"),
    ],
)
def test_bad_arguments_are_named(call, word):
    with pytest.raises(ValueError, match=word):
        call()
