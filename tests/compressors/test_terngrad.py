"""TernGrad (Wen et al. 2017): ternary codes, l_inf scale, optional clipping at c * std."""

from __future__ import annotations

import pytest
import torch
from _quant_checks import check_mean_equals, check_unbiased, draws, laplace

from gradstat.compressors import create
from gradstat.compressors.schemes.quantizers.terngrad import TernGrad


def test_bits_are_two_per_element_plus_the_scale():
    p = TernGrad().encode(torch.randn(1000))
    assert p.bits == 2 * 1000 + 32 and set(p.parts) == {"codes", "scales"}
    assert TernGrad(bucket=300).encode(torch.randn(1000)).bits == 2000 + 4 * 32


def test_outputs_are_ternary_with_bernoulli_probability_abs_g_over_max():
    g = torch.tensor([0.5, -0.25, 1.0, 0.0])
    out = draws(TernGrad(), g, 4000)
    assert set(out.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert check_mean_equals((out[:, 0] != 0).double(), 0.5) == []
    assert check_mean_equals((out[:, 1] != 0).double(), 0.25) == []
    assert bool((out[:, 2] == 1).all()) and bool((out[:, 3] == 0).all())


def test_terngrad_is_unbiased():
    assert check_unbiased(TernGrad(), laplace(1024, 5), trials=400) == []


def test_clipping_bounds_the_scale_at_c_std_and_declares_bias():
    g = torch.cat([torch.randn(999), torch.tensor([100.0])])
    c = TernGrad(clip=2.5)
    p = c.encode(g)
    assert torch.allclose(p["scales"], 2.5 * g.std(correction=0).reshape(1))
    assert c.properties.unbiased is False and TernGrad().properties.unbiased is True
    assert float(c(g).abs().max()) <= float(2.5 * g.std(correction=0)) * (1 + 1e-6)


def test_clipping_makes_it_biased_for_the_unclipped_gradient():
    g = torch.cat([laplace(511, 6), torch.tensor([40.0])])
    assert check_unbiased(TernGrad(clip=2.5), g, trials=300) != []


@pytest.mark.parametrize("spec", ["terngrad:clip=-1", "terngrad:clip=inf", "terngrad:bucket=-2"])
def test_bad_parameters_are_rejected(spec):
    with pytest.raises(ValueError, match="terngrad"):
        create(spec)


def test_bits_match_the_theory_count():
    from gradstat.theory.bits import terngrad_bits

    assert TernGrad().encode(torch.randn(1000)).bits == terngrad_bits(1000)
