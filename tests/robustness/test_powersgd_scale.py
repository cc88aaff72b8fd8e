"""PowerSGD at every scale of the gradient: the factors share the power of two at max |g| (Vogels et al. 2019,
Algorithm 1, run on the normalised matrix), so scaling g by 2^k scales the reconstruction by exactly 2^k, up to
|g| ~ 3e38, where sending the whole factor on Q made 2,100 decoded values non-finite."""

from __future__ import annotations

import pytest
import torch

from gradstat import compressors
from gradstat.compressors import Context

F32_MAX = torch.finfo(torch.float32).max


def gradients() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    return {
        "constant vector": torch.ones(10_000),
        "gaussian vector": torch.randn(10_000, generator=gen),
        "gaussian matrix": torch.randn(100, 100, generator=gen),
        "uniform 4-d": torch.rand(8, 4, 5, 5, generator=gen) * 2 - 1,
    }


def roundtrip(spec: str, g: torch.Tensor) -> torch.Tensor:
    c = compressors.create(spec)
    return c.decode(c.encode(g, Context(seed=7)), Context(seed=7))


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("case", list(gradients()))
@pytest.mark.parametrize("exponent", [-100, -60, 60, 127])
def test_the_reconstruction_scales_exactly_with_the_gradient(case, rank, exponent):
    g = gradients()[case]
    g = g / g.abs().max()  # max |g| = 1, so 2^127 g reaches 1.7e38
    base = roundtrip(f"powersgd:rank={rank}", g)
    scaled = roundtrip(f"powersgd:rank={rank}", g * 2.0**exponent)
    assert torch.isfinite(scaled).all()
    assert torch.equal(scaled, base * 2.0**exponent)


@pytest.mark.parametrize("case", list(gradients()))
def test_a_gradient_at_3e38_decodes_finite_and_close_to_its_scale_1_reconstruction(case):
    g = gradients()[case]
    g = g / g.abs().max() * 3e38
    out = roundtrip("powersgd:rank=1", g)
    assert torch.isfinite(out).all() and float(out.abs().max()) <= F32_MAX
    small = roundtrip("powersgd:rank=1", g / 2.0**64 / 2.0**64)
    assert torch.equal(out, small * 2.0**64 * 2.0**64)  # 2^128 itself is beyond float32
