"""DQSG and half-dithered DQSG (002_87c17e3716ede1d0.txt Sec. 3.1, eq. (2), Lemma 3, App. B)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from _quant_checks import check_mean_equals, check_unbiased, draws, laplace

import gradstat.compressors.schemes.quantizers.dither as dither
import gradstat.theory.kernels.counter_dither as counter_dither
from gradstat.analysis.validation.bugs import decoder_dither
from gradstat.compressors import Context, create
from gradstat.compressors.schemes.quantizers.dqsg import DQSG
from gradstat.theory.dqsg import conditional_error

TRIALS = 400


def check_exact_variance(c: DQSG, g: torch.Tensor, trials: int = TRIALS, confidence: float = 0.999) -> list[str]:
    """Lemma 3 / App. B: ``E[||g_tilde - g||^2 | g] = ||g||_inf^2 n Delta^2 / 12`` (summed over partitions), as a
    two-sided z-test of the Monte Carlo mean of ``||g_tilde - g||^2`` over ``trials`` seeds (99.9 %)."""
    size = -(-g.numel() // c.partitions)
    exact = sum(conditional_error(part.double().numpy(), c.delta) for part in g.split(size))
    errs = ((draws(c, g, trials) - g.double()) ** 2).sum(1)
    return check_mean_equals(errs, exact, confidence)


@pytest.mark.parametrize("M,K", [(1, 1), (2, 1), (4, 5), (8, 3)])
def test_error_variance_equals_linf2_n_delta2_over_12(M, K):
    assert check_exact_variance(DQSG(M=M, partitions=K), laplace(2000, M + K)) == []


@pytest.mark.parametrize("source", ["counter", "torch"])
def test_not_subtracting_the_dither_fails_the_exact_variance_check(monkeypatch, source):
    """A DQSG whose decoder forgets to subtract the dither (half-dithered in disguise) is caught, on either
    dither's decoding path: torch's here, the counter one through the validation suite's own planted bug."""
    monkeypatch.setattr(dither, "reconstruct", lambda codes, u, offset=0.0: codes.float() + offset)
    with contextlib.ExitStack() as stack:
        for patch in decoder_dither(1.0):
            stack.enter_context(patch)
        assert check_exact_variance(DQSG(M=2, dither=source), laplace(2000, 1)) != []


def test_half_dithered_is_caught_by_the_exact_check_but_matches_its_own_variance():
    g = laplace(2000, 2)
    half = DQSG(M=2, half=True)
    assert check_exact_variance(half, g) != []
    errs = ((draws(half, g, TRIALS) - g.double()) ** 2).sum(1)
    assert check_mean_equals(errs, float(half.expected_error(g))) == []


@pytest.mark.parametrize("half", [False, True])
def test_dqsg_is_unbiased(half):
    assert check_unbiased(DQSG(M=2, half=half), laplace(1024, 3), trials=TRIALS) == []


@pytest.mark.parametrize(
    "M,K,half,expected",
    [
        (2, 1, False, 1000 * 3 + 32 + 64),  # 5 levels -> 3 bits, one kappa, the seed
        (2, 1, True, 1000 * 3 + 32),  # half-dithered: the receiver needs no seed
        (1, 4, False, 1000 * 2 + 4 * 32 + 64),  # ternary, 4 partitions of 250
        (4, 3, False, 1000 * 4 + 3 * 32 + 64),  # 9 levels -> 4 bits, partitions of 334, 334, 332
        (2, 2000, False, 1000 * 3 + 1000 * 32 + 64),  # more partitions than elements: one per element
    ],
)
def test_bits_hand_count(M, K, half, expected):
    assert DQSG(M=M, partitions=K, half=half).encode(torch.randn(1000)).bits == expected


@pytest.mark.parametrize("source", ["counter", "torch"])
def test_reconstruction_is_the_dithered_formula_of_algorithm_1(source):
    """g_tilde = kappa (Delta q - u) with q = round(g/kappa/Delta + u/Delta), u regenerated from the seed: element
    i's counter uniform of (seed, i), or torch's i-th draw."""
    g = torch.tensor([0.3, -1.2, 0.05, 0.9])
    ctx = Context(seed=4)
    p = DQSG(M=2, dither=source).encode(g, ctx)
    if source == "torch":
        unit = dither.draw_dither(4, ctx.call_seed, torch.device("cpu"))
    else:
        key = counter_dither.keys(ctx.call_seed, dither.DITHER_STREAM, "cpu")
        unit = counter_dither.dither_rows(1, 4, torch.tensor(0, dtype=torch.int32), key, torch.device("cpu"))[0]
    u = unit / 2  # U[-Delta/2, Delta/2], Delta = 1/2
    q = torch.floor((g / 1.2 + u) * 2 + 0.5)
    assert torch.equal(p["codes"].float(), q)
    assert torch.allclose(DQSG(M=2, dither=source).decode(p, ctx), 1.2 * (0.5 * q - u))


def test_partitions_reduce_the_error_of_a_vector_with_one_large_part():
    g = torch.cat([laplace(1000, 5) * 100, laplace(1000, 6)])
    assert float(DQSG(M=2, partitions=2).expected_error(g)) < 0.6 * float(DQSG(M=2).expected_error(g))


@pytest.mark.parametrize("spec,msg", [("dqsg:M=0", "dqsg M"), ("dqsg:partitions=0", "dqsg partitions")])
def test_bad_parameters_are_rejected(spec, msg):
    with pytest.raises(ValueError, match=msg):
        create(spec)
