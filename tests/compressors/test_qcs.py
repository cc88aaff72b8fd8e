"""QCS: unbiased, MMSE and 1-bit (000_4b111efa75352b2d.txt eq. (1)-(14), Lemma 1, Theorem 2, Lemma 3-4)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from _quant_checks import check_mean_at_most, check_unbiased, laplace, relative_errors

from gradstat.compressors import Context, ErrorFeedback, create
from gradstat.compressors.schemes.quantizers.qcs import QCS, mix, rademacher, unmix
from gradstat.theory import qcs as theory_qcs

F64 = torch.float64


def mixing_matrix(n: int, k: int, r: torch.Tensor) -> torch.Tensor:
    """T (k x n) of eq. (1) as the compressor applies it: column j is mix(e_j)."""
    eye = torch.eye(n, dtype=F64)
    return mix(eye, r.expand(n, n), k).T


# -- Lemma 1 --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", [(8, 3), (64, 16), (96, 40), (100, 7), (256, 256)])
def test_lemma1_t_t_transpose_is_n_over_k_identity(n, k):
    r = rademacher((1, n), seed=n + k, device=torch.device("cpu")).double()
    t = mixing_matrix(n, k, r)
    assert torch.allclose(t @ t.T, (n / k) * torch.eye(k, dtype=F64), atol=1e-10)


@pytest.mark.parametrize("n,k", [(8, 3), (12, 5)])
def test_lemma1_expected_t_transpose_t_is_identity_exactly(n, k):
    """E[T^T T] = I, averaging over all 2^n Rademacher vectors (an exact expectation, not a sample)."""
    total = torch.zeros(n, n, dtype=F64)
    for signs in itertools.product((-1.0, 1.0), repeat=n):
        t = mixing_matrix(n, k, torch.tensor(signs, dtype=F64)[None])
        total += t.T @ t
    assert torch.allclose(total / 2**n, torch.eye(n, dtype=F64), atol=1e-10)


def test_unmix_is_the_transpose_of_mix():
    gen = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 96, generator=gen, dtype=F64), torch.randn(3, 24, generator=gen, dtype=F64)
    r = rademacher((3, 96), seed=1, device=torch.device("cpu")).double()
    assert torch.allclose((mix(x, r, 24) * v).sum(1), (x * unmix(v, r)).sum(1), atol=1e-10)


# -- bits -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec,d,expected",
    [
        ("qcs:k=64,Q=4,block=256", 1000, 4 * 64 * 4 + 4 * 32 + 64),  # 4 blocks (last padded), 9 levels: 4 bits
        ("qcs:k=64,Q=1,block=256", 1024, 4 * 64 * 2 + 4 * 32 + 64),  # ternary codes: 2 bits
        ("qcs:k=128,block=256,onebit=true", 1000, 4 * 128 * 1 + 4 * 32 + 64),
        ("qcs:k=40,Q=7,block=96", 96, 40 * 4 + 32 + 64),  # 15 levels: 4 bits
        ("qcs:k=100,Q=2,block=100", 250, 3 * 100 * 3 + 3 * 32 + 64),
    ],
)
def test_bits_hand_count(spec, d, expected):
    p = create(spec).encode(torch.randn(d))
    assert p.bits == expected
    assert set(p.parts) == {"codes", "scales", "seed"}


def test_bits_match_the_theory_count():
    from gradstat.theory.bits import qcs_bits

    c = QCS(k=64, Q=4, block=256)
    assert c.encode(torch.randn(256)).bits == qcs_bits(256, 64, 4, scale_bits=32, seed_bits=64)
    onebit = QCS(k=128, block=256, onebit=True)
    assert onebit.encode(torch.randn(256)).bits == qcs_bits(256, 128, None, scale_bits=32, seed_bits=64)


# -- Theorem 2, Lemma 3 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec",
    ["qcs:k=64,Q=4,block=256", "qcs:k=32,Q=2,block=96", "qcs:k=128,block=256,onebit=true", "qcs:k=1,Q=1,block=64"],
)
def test_unbiased_qcs_is_unbiased(spec):
    assert check_unbiased(create(spec), laplace(512, 1), trials=400) == []


@pytest.mark.parametrize(
    "spec",
    [
        "qcs:k=64,Q=4,block=256",
        "qcs:k=16,Q=1,block=256",
        "qcs:k=50,Q=3,block=100",
        "qcs:k=128,block=256,onebit=true",
        "qcs:k=2,Q=1,block=32",
    ],
)
def test_unbiased_error_within_gamma(spec):
    """Theorem 2 (10): E||e||^2 / ||g||^2 <= gamma (99.9 % one-sided lower confidence limit)."""
    c = create(spec)
    errs = relative_errors(c, laplace(1024, 2), 200)
    assert check_mean_at_most(errs, c.gamma) == []


def test_gamma_is_the_theory_value_and_the_one_bit_range_is_one_half():
    assert QCS(k=64, Q=4, block=256).gamma == theory_qcs.gamma(256, 64, 4)
    onebit = QCS(k=64, block=256, onebit=True).gamma
    assert onebit == pytest.approx(256 / 64 - 1 + 256 / (4 * 0.25) * math.log(64) / 63)


@pytest.mark.parametrize(
    "spec",
    [
        "qcs:k=64,Q=4,block=256,alpha=mmse",
        "qcs:k=16,Q=1,block=96,alpha=mmse",
        "qcs:k=128,block=256,onebit=true,alpha=mmse",
    ],
)
def test_mmse_error_within_one_minus_alpha(spec):
    """Lemma 3 (13): E||e||^2 <= (1 - alpha) ||g||^2 with alpha = 1/(gamma + 1) (99.9 % one-sided)."""
    c = create(spec)
    assert c.reconstruction_scale() == pytest.approx(theory_qcs.mmse_alpha(c.gamma))
    errs = relative_errors(c, laplace(1024, 3), 200)
    assert check_mean_at_most(errs, 1 - c.reconstruction_scale()) == []
    assert c.properties.unbiased is False and c.properties.bound == "qcs_mmse"


def test_mmse_is_biased_and_shrinks_the_gradient():
    c = QCS(k=16, Q=1, block=256, alpha="mmse")
    assert check_unbiased(c, laplace(512, 4), trials=200) != []


def test_alpha_1_1_fails_the_unbiasedness_check():
    """A QCS reconstructing with alpha = 1.1 while claiming to be unbiased is caught."""

    class Wrong(QCS):
        def reconstruction_scale(self) -> float:
            return 1.1

    assert check_unbiased(Wrong(k=64, Q=4, block=256), laplace(512, 1), trials=400) != []


def test_full_rank_fine_quantizer_reconstructs_every_paper_block_size():
    """k = n and a large Q: g_hat = T^T T g + noise = g up to quantization (H H^T = n I inside the fast path)."""
    g = laplace(2000, 5)
    for n in (96, 100, 192, 200, 288, 320, 384, 256):
        out = QCS(k=n, Q=2**14, block=n)(g, Context(seed=n))
        assert float(((out - g) ** 2).sum() / (g**2).sum()) < 1e-6


# -- Algorithm 1: the seed regenerates r and u ------------------------------------------------------------------
def test_decoder_regenerates_signs_and_dither_from_the_sent_seed(device):
    g = laplace(700, 6).to(device)
    ctx = Context(seed=11, step=2, worker=3, block=1)
    p = QCS().encode(g, ctx)
    assert int(p["seed"][0]) == ctx.call_seed
    assert torch.equal(QCS().decode(p, ctx), create(QCS().spec()).decode(p, Context()))


# -- weighted error feedback (14), Lemma 4 ----------------------------------------------------------------------
def _residual_norms(c: QCS, fb: ErrorFeedback, g: torch.Tensor, steps: int) -> list[float]:
    state, out = fb.new_state(), []
    for t in range(steps):
        z = fb.compensate(g, state)
        fb.update(z, c(z, Context(seed=t)), state)
        out.append(float((state.residual**2).sum()))
    return out


def test_weighted_feedback_with_optimal_beta_keeps_the_residual_under_eta_b():
    """Lemma 4 (15) at beta_u* = 1/(gamma+1) (17): E||r_t||^2 <= eta B, B = ||g||^2 (a fixed gradient); the
    time-average over steps 50..250 is compared (the bound holds at every t, so also on average)."""
    c = QCS(k=32, Q=2, block=128)
    beta, eta = theory_qcs.optimal_feedback_unbiased(c.gamma)
    g = laplace(1024, 7)
    norms = torch.tensor(_residual_norms(c, ErrorFeedback.qcs(beta), g, 250)[50:], dtype=F64)
    assert float(norms.mean()) <= eta * float((g**2).sum())


def test_plain_error_feedback_with_unbiased_qcs_and_gamma_above_one_diverges():
    """The paper's warning after Lemma 4: beta = 1 with gamma > 1 gives an unbounded residual."""
    c = QCS(k=32, Q=2, block=128)
    assert c.gamma > 1
    norms = _residual_norms(c, ErrorFeedback.qcs(1.0), laplace(1024, 8), 40)
    assert norms[-1] > 1e6 * norms[0]


# -- errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec,msg",
    [
        ("qcs:block=6", "order 6"),
        ("qcs:k=0", "qcs k"),
        ("qcs:k=300,block=256", r"\[1, block=256\]"),
        ("qcs:Q=0", "qcs Q"),
        ("qcs:alpha=half", "not one of"),
        ("qcs:block=0", "qcs block"),
    ],
)
def test_bad_parameters_are_rejected(spec, msg):
    with pytest.raises(ValueError, match=msg):
        create(spec)
