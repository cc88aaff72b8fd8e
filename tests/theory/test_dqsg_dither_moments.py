"""DQSG Sec. 2.1.1: the half-dithered error's moments with a dither summing k uniforms, measured against the
exact values, and the paper's printed statement ("the k-th moment is (k + 1) Delta^2 / 12") shown to be a misprint:
that value is the second moment, and only for k >= 2."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradstat.theory.dqsg import (
    half_dither_error_moment,
    half_dithered_quantize,
    printed_half_dither_moment,
    sum_uniform_moment,
)

DELTA = 0.5
SAMPLES = 400_000


def _errors(x: float, k: int, seed: int = 0) -> np.ndarray:
    gen = np.random.default_rng([seed, k])
    u = gen.uniform(-DELTA / 2, DELTA / 2, size=(k, SAMPLES)).sum(0)
    return x - half_dithered_quantize(np.full(SAMPLES, x), u, DELTA)


def _moment_ci(e: np.ndarray, order: int) -> tuple[float, float]:
    """Mean of e^order with a 99.9 % normal interval's half-width."""
    v = e**order
    return float(v.mean()), 3.3 * float(v.std()) / math.sqrt(v.size)


def test_uniform_sums_have_their_known_moments():
    assert sum_uniform_moment(2, 1, 1.0) == pytest.approx(1 / 12)
    assert sum_uniform_moment(4, 1, 1.0) == pytest.approx(1 / 80)
    assert sum_uniform_moment(2, 3, 1.0) == pytest.approx(3 / 12)
    assert sum_uniform_moment(4, 2, 1.0) == pytest.approx(2 / 80 + 6 / 144)  # E[(a+b)^4], a, b iid
    assert sum_uniform_moment(3, 4, 1.0) == 0.0


@pytest.mark.parametrize("x", [0.0, 0.07, 0.2, 0.33])
def test_second_moment_is_k_plus_1_steps_over_12_for_k_of_2_at_every_x(x):
    mean, half = _moment_ci(_errors(x, 2), 2)
    assert abs(mean - half_dither_error_moment(2, 2, DELTA)) < half
    assert half_dither_error_moment(2, 2, DELTA) == pytest.approx(3 * DELTA**2 / 12)


def test_with_one_uniform_the_second_moment_depends_on_x():
    f = 0.2 / DELTA
    mean, half = _moment_ci(_errors(0.2, 1), 2)
    assert abs(mean - DELTA**2 * f * (1 - f)) < half  # Delta^2 f (1 - f), not 2 Delta^2 / 12
    assert abs(mean - 2 * DELTA**2 / 12) > 10 * half
    with pytest.raises(ValueError, match="order"):
        half_dither_error_moment(2, 1, DELTA)


@pytest.mark.parametrize("x", [0.05, 0.2])
def test_the_printed_kth_moment_is_a_misprint_measured_at_k_3(x):
    mean, half = _moment_ci(_errors(x, 3), 3)
    assert abs(mean - half_dither_error_moment(3, 3, DELTA)) < half  # E[eps^3] = 0
    printed = printed_half_dither_moment(3, DELTA)
    assert abs(mean - printed) > 50 * half  # 4 Delta^2 / 12 as printed: far from every measurement


def test_the_printed_value_is_the_second_moment_at_k_3():
    mean, half = _moment_ci(_errors(0.11, 3), 2)
    assert abs(mean - printed_half_dither_moment(3, DELTA)) < half
