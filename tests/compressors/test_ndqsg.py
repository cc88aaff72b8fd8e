"""NDQSG: nested dithered quantization with side information (002_87c17e3716ede1d0.txt Sec. 3.2, Alg. 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _quant_checks import check_mean_equals, laplace

from gradstat.compressors import Context, create
from gradstat.compressors.schemes.quantizers.dqsg import DQSG
from gradstat.compressors.schemes.quantizers.ndqsg import NDQSG
from gradstat.theory import dqsg as theory_dqsg
from gradstat.theory.kernels.nested import nested_decode, nested_encode

F64 = torch.float64


def test_worked_example_of_fig_3():
    """Delta1 = 1, Delta2 = 3, alpha = 1, x = -4.2, u = 0.3: s = -1; with y = -3.4 the decoder gives -4.3."""
    s = nested_encode(torch.tensor([-4.2], dtype=F64), torch.tensor([0.3], dtype=F64), 1.0, 3)
    assert s.tolist() == [-1.0]
    x_hat = nested_decode(s, torch.tensor([0.3], dtype=F64), torch.tensor([-3.4], dtype=F64), 1.0, 3)
    assert x_hat.tolist() == pytest.approx([-4.3], abs=1e-12)
    # the values with the same s and dither, -4.3 + 3j, are resolved by the side information's coarse bin. (The
    # paper lists "-4.3, -1.3, 2.7, ...": 2.7 is a misprint for 1.7; 2.7 + 0.3 = 3 encodes to s = 0.)
    assert nested_encode(torch.tensor([1.7, 2.7], dtype=F64), torch.tensor([0.3, 0.3], dtype=F64), 1.0, 3).tolist() == [
        -1.0,
        0.0,
    ]
    for y, expected in ((-1.0, -1.3), (2.5, 1.7)):
        assert nested_decode(
            s, torch.tensor([0.3], dtype=F64), torch.tensor([y], dtype=F64), 1.0, 3
        ).item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_wrapped_indices_decode_like_the_unwrapped_q1_minus_q2(k):
    """The index is sent modulo k (k symbols); decoding gives what eq. (6)-(7) give with the literal s."""
    gen = torch.Generator().manual_seed(k)
    x = torch.rand(5000, generator=gen, dtype=F64) * 4 - 2
    u = (torch.rand(5000, generator=gen, dtype=F64) - 0.5) * 0.25
    y = x + (torch.rand(5000, generator=gen, dtype=F64) - 0.5) * 0.3
    s = nested_encode(x, u, 0.25, k, 0.8)
    assert set(s.unique().tolist()) <= set(range(-((k - 1) // 2), k - (k - 1) // 2))
    literal = theory_dqsg.nested_encode(x.numpy(), u.numpy(), 0.25, 0.25 * k, 0.8) / 0.25
    expected = theory_dqsg.nested_decode(literal * 0.25, u.numpy(), y.numpy(), 0.25, 0.25 * k, 0.8)
    assert np.allclose(nested_decode(s, u, y, 0.25, k, 0.8).numpy(), expected, atol=1e-9)


def _workers(P, noise, d=4000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    true = torch.randn(d, generator=gen)
    return [true + noise * torch.randn(d, generator=gen) for _ in range(P)]


def test_round_with_correlated_workers_decodes_without_failure_within_half_a_fine_step():
    """alpha = 1, no failure: every P2 element is within kappa Delta1 / 2 of the worker's gradient."""
    grads = _workers(8, noise=0.02)
    c = NDQSG(p1=4, M=2, delta1=1 / 3, delta2=1.0)
    res = c.round(grads, Context(seed=1))
    assert int(res.info["decoding_failures"]) == 0 and res.info["p1"] == 4 and res.info["p2"] == 4
    for w in range(4, 8):
        kappa = float(grads[w].abs().max())
        assert float((res.decoded[w] - grads[w]).abs().max()) <= kappa / 6 * (1 + 1e-5)
    assert torch.allclose(res.mean, torch.stack(res.decoded).mean(0), atol=1e-6)


def test_decoding_failures_are_counted():
    """Uncorrelated workers: many elements fall in the wrong coarse bin; the count equals the number of P2
    elements decoded further than kappa Delta1 / 2 from the truth (alpha = 1)."""
    grads = _workers(4, noise=3.0)
    c = NDQSG(p1=1, delta1=0.25, delta2=0.5)
    res = c.round(grads, Context(seed=2))
    far = sum(
        int(((res.decoded[w] - grads[w]).abs() > grads[w].abs().max() * 0.125 * (1 + 1e-5)).sum()) for w in range(1, 4)
    )
    assert far > 100 and int(res.info["decoding_failures"]) == far
    assert sum(int(v) for v in res.info["failures_per_worker"].values()) == far


def test_error_variance_without_failure_is_that_of_dithered_quantization():
    """Eq. (9) with alpha = 1: alpha^2 Delta1^2 / 12 per element (in units of kappa), 99.9 % z-test."""
    grads = _workers(2, noise=0.01, d=20000)
    c = NDQSG(p1=1, delta1=0.2, delta2=1.0)
    res = c.round(grads, Context(seed=3))
    assert int(res.info["decoding_failures"]) == 0
    kappa = grads[1].abs().max().double()
    e = ((res.decoded[1].double() - grads[1].double()) / kappa) ** 2
    assert check_mean_equals(e, 0.2**2 / 12) == []


def test_bits_hand_count():
    """P1 sends DQSG (3-bit codes for M = 2, kappa, seed); P2 sends ceil(log2 k) bits per element, kappa, seed."""
    grads = _workers(3, noise=0.1, d=1000)
    res = NDQSG(p1=1, M=2, delta1=1 / 3, delta2=1.0).round(grads)
    assert [p.bits for p in res.payloads] == [3000 + 32 + 64, 2000 + 32 + 64, 2000 + 32 + 64]
    assert NDQSG(p1=1, delta1=0.125, delta2=1.0).encode(grads[0], Context(worker=1)).bits == 3000 + 96


def test_p1_payload_is_dqsg_and_p2_payload_needs_side_information():
    g = laplace(500, 4)
    c = NDQSG(p1=1)
    p1 = c.encode(g, Context(worker=0, seed=5))
    assert torch.equal(c.decode(p1, Context(worker=0, seed=5)), DQSG(M=2).decode(p1, Context(worker=0, seed=5)))
    p2 = c.encode(g, Context(worker=1, seed=5))
    with pytest.raises(ValueError, match="side information"):
        c.decode(p2, Context(worker=1, seed=5))
    with pytest.raises(ValueError, match="500 elements"):
        c.decode(p2, Context(worker=1, seed=5), side=torch.zeros(3))


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("ndqsg:delta1=0.3,delta2=1", "integer k > 1"),
        ("ndqsg:delta1=1,delta2=1", "integer k > 1"),
        ("ndqsg:alpha=0", "alpha"),
        ("ndqsg:alpha=1.5", "alpha"),
        ("ndqsg:p1=0", "p1"),
        ("ndqsg:delta1=-1", "delta1"),
    ],
)
def test_bad_parameters_are_rejected(spec, msg):
    with pytest.raises(ValueError, match=msg):
        create(spec)


def test_spec_strings_may_write_one_third_approximately():
    c = create("ndqsg:delta1=0.333333,delta2=1")
    assert c.nesting == 3 and c.fine_step == 1 / 3


@pytest.mark.parametrize("k", [2, 3, 4, 7, 255])
def test_the_small_remainder_is_torch_s_remainder_over_its_whole_range(k):
    """The fused encode's modulo (two conditional additions and subtractions) equals ``torch.remainder`` on every
    integer of [-2k, 3k), the range the nested index can reach after rounding."""
    from gradstat.theory.kernels.nested import _small_remainder

    v = torch.arange(-2 * k, 3 * k, dtype=torch.float32)
    assert torch.equal(_small_remainder(v, k), torch.remainder(v, k))


@pytest.mark.parametrize("source", ["counter", "torch"])
def test_a_tiny_fine_step_keeps_the_codes_in_their_width(source):
    """Delta1 = 1e-9 puts t near 1e9, where float32 rounds t/k by many multiples of k: the nested index must still
    be taken modulo k exactly, so every code fits its ceil(log2 k) bits and the payload serialises."""
    c = create(f"ndqsg:delta1=1e-9,delta2=3e-9,dither={source}")
    payload = c.encode(laplace(5000, 8), Context(seed=2, worker=1))
    codes = payload["nested"]
    assert int(codes.min()) >= -1 and int(codes.max()) <= 1
    payload.to_bytes()


@pytest.mark.parametrize("cls", [DQSG, NDQSG])
def test_an_unknown_dither_source_is_refused_at_construction(cls):
    with pytest.raises(ValueError, match="dither must be 'torch' or 'counter'"):
        cls(dither="Counter")
