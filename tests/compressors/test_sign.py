"""signSGD and EF-signSGD's scaled sign."""

from __future__ import annotations

import pytest
import torch
from _quant_checks import laplace

from gradstat.compressors import Context, ErrorFeedback, create
from gradstat.compressors.schemes.quantizers.sign import SignSGD


def test_scaled_sign_hand_example():
    """(||g||_1 / d) sign(g) with sign(0) = +1: [1, -2, 0, 3] -> 1.5 [1, -1, 1, 1]; d bits + one float32."""
    g = torch.tensor([1.0, -2.0, 0.0, 3.0])
    p = SignSGD().encode(g)
    assert p.bits == 4 + 32
    assert SignSGD().decode(p).tolist() == [1.5, -1.5, 1.5, 1.5]


def test_unit_sign_sends_only_the_bits():
    g = torch.tensor([1.0, -2.0, 0.0, 3.0])
    p = SignSGD(scale="unit").encode(g)
    assert p.bits == 4 and SignSGD(scale="unit").decode(p).tolist() == [1.0, -1.0, 1.0, 1.0]
    assert SignSGD(scale="unit").properties.contraction is None


def test_scaled_sign_error_is_one_minus_l1_squared_over_d_l2_squared():
    """Karimireddy et al.: ||C(g) - g||^2 = (1 - ||g||_1^2 / (d ||g||_2^2)) ||g||^2 <= (1 - 1/d) ||g||^2."""
    g = laplace(1000, 1).double()
    err = float(((SignSGD()(g) - g) ** 2).sum())
    expected = float((1 - g.abs().sum() ** 2 / (1000 * (g**2).sum())) * (g**2).sum())
    assert err == pytest.approx(expected, rel=1e-6)
    assert err <= (1 - 1 / 1000) * float((g**2).sum())


def test_ef_signsgd_keeps_the_residual_bounded():
    """EF-signSGD (scaled sign + plain error feedback) on a fixed gradient: the average update converges to g."""
    g = laplace(200, 2)
    fb, c = ErrorFeedback.plain(), SignSGD()
    state, total = fb.new_state(), torch.zeros(200)
    for t in range(400):
        z = fb.compensate(g, state)
        z_hat = c(z, Context(step=t))
        fb.update(z, z_hat, state)
        total += z_hat
    assert float((total / 400 - g).norm()) < 0.05 * float(g.norm())


def test_bad_scale_is_rejected():
    with pytest.raises(ValueError, match="not one of"):
        create("signsgd:scale=l2")
