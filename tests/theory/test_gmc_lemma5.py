"""GMC's Lemma 5 constant C (eq. (9)) and Theorem 9 at beta > 0: the memory bound and C depend on each other, so
the pair is solved as a fixed point, finite only below a momentum of about s / (4 d)."""

from __future__ import annotations

import math

import pytest

from gradstat.theory.gmc import (
    largest_bounded_momentum,
    lemma5_constant,
    memory_bound,
    memory_bound_with_momentum,
)


def test_lemma5_constant_by_hand():
    # beta = 0.5: 2 * 0.25 * (3 * 4 + 6 * 9) / 0.0625 + 2 * 9 / 0.25
    assert lemma5_constant(2.0, 9.0, 0.5) == pytest.approx(0.5 * 66 / 0.0625 + 72)
    assert lemma5_constant(2.0, 9.0, 0.0) == pytest.approx(18.0)


def test_at_zero_momentum_it_is_theorem_9():
    assert memory_bound_with_momentum(1000, 10, 3.0, 0.0) == pytest.approx(memory_bound(1000, 10, 3.0, 0.0, 0.0))


@pytest.mark.parametrize("d, s", [(1000, 10), (1000, 100), (50, 7)])
def test_the_bound_is_self_consistent_below_the_largest_momentum(d, s):
    beta = 0.5 * largest_bounded_momentum(d, s)
    u2 = memory_bound_with_momentum(d, s, 1.5, beta)
    c = lemma5_constant(1.5, u2, beta)
    assert u2 == pytest.approx(memory_bound(d, s, 1.5, beta, c), rel=1e-9)  # Theorem 9 with its own C
    assert u2 > memory_bound(d, s, 1.5, 0.0, 0.0)


def test_no_finite_bound_at_or_above_the_largest_momentum():
    top = largest_bounded_momentum(1000, 10)
    assert top == pytest.approx(10 / (4 * 1000), rel=0.01)
    assert math.isinf(memory_bound_with_momentum(1000, 10, 1.0, 0.9))
    assert math.isinf(memory_bound_with_momentum(1000, 10, 1.0, min(top * 1.001, 0.999)))
    assert math.isfinite(memory_bound_with_momentum(1000, 10, 1.0, top * 0.999))


@pytest.mark.parametrize("bad", [{"momentum": 1.0}, {"momentum": -0.1}, {"grad_bound": -1.0}])
def test_bad_inputs_get_clear_errors(bad):
    args = {"d": 100, "s": 10, "grad_bound": 1.0, "momentum": 0.1, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        memory_bound_with_momentum(**args)
