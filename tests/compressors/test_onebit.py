"""1-bit SGD (Seide et al. 2014): sign bits and per-column (or per-row) mean reconstruction values."""

from __future__ import annotations

import pytest
import torch
from _quant_checks import laplace

from gradstat.compressors import Context, ErrorFeedback, create
from gradstat.compressors.schemes.quantizers.onebit import OneBit


def test_hand_example_per_column():
    """Column 0: {1, 3} >= 0 -> 2, {-2} -> -2. Column 1: {0.5} -> 0.5, {-1, -3} -> -2. Bits 6 + 2 x 2 x 32."""
    g = torch.tensor([[1.0, -1.0], [-2.0, 0.5], [3.0, -3.0]])
    p = OneBit().encode(g)
    assert p.bits == 6 + 2 * 2 * 32
    assert OneBit().decode(p).tolist() == [[2.0, -2.0], [-2.0, 0.5], [2.0, -2.0]]


def test_hand_example_per_row():
    g = torch.tensor([[1.0, -1.0, 3.0], [-2.0, -4.0, 0.0]])
    p = OneBit(axis="row").encode(g)
    assert p.bits == 6 + 2 * 2 * 32
    assert OneBit(axis="row").decode(p).tolist() == [[2.0, -1.0, 2.0], [-3.0, -3.0, 0.0]]


def test_one_dimensional_input_is_one_column_or_the_given_columns():
    g = torch.tensor([1.0, 2.0, -3.0, -5.0, 4.0, 0.0])
    assert OneBit().decode(OneBit().encode(g)).tolist() == [7 / 4, 7 / 4, -4.0, -4.0, 7 / 4, 7 / 4]
    c = OneBit(columns=2)  # view (3, 2): columns [1,-3,4], [2,-5,0]
    assert c.encode(g).bits == 6 + 2 * 2 * 32
    assert c.decode(c.encode(g)).tolist() == [2.5, 1.0, -3.0, -5.0, 2.5, 1.0]
    with pytest.raises(ValueError, match="columns=4 must divide"):
        OneBit(columns=4).encode(g)


def test_error_is_a_contraction_by_one_over_group_size():
    g = laplace(4000, 3).reshape(40, 100)  # per column: groups of m = 40
    err = float(((OneBit()(g) - g) ** 2).sum() / (g**2).sum())
    assert err <= 1 - 1 / 40
    assert OneBit().contraction_constant(g) == 1 - 1 / 40


def test_with_error_feedback_nothing_is_lost_over_time():
    """Seide et al. use 1-bit quantization with error feedback: sent + residual = sum of gradients."""
    grads = [laplace(300, s) for s in range(20)]
    fb, c = ErrorFeedback.plain(), OneBit()
    state, sent = fb.new_state(), torch.zeros(300)
    for t, g in enumerate(grads):
        z = fb.compensate(g, state)
        z_hat = c(z, Context(step=t))
        fb.update(z, z_hat, state)
        sent += z_hat
    assert torch.allclose(sent + state.residual, sum(grads), atol=1e-4)
    assert float(state.residual.norm()) < float(sum(grads).norm())


@pytest.mark.parametrize("spec", ["onebit:axis=diagonal", "onebit:columns=-1"])
def test_bad_parameters_are_rejected(spec):
    with pytest.raises(ValueError, match="onebit|not one of"):
        create(spec)
