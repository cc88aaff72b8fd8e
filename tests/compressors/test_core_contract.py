"""The compressor contract itself: payload accounting, seeded contexts, registry spec strings, feedback algebra."""

from __future__ import annotations

import math

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context, derive_seed, generator
from gradstat.compressors.memory.feedback import ErrorFeedback, parse_feedback
from gradstat.compressors.registry import create, parse_spec
from gradstat.compressors.wire.payload import Payload, code_width, empirical_entropy, index_width


# -- payload ------------------------------------------------------------------------------------------------
def test_payload_bits_are_the_sum_of_parts_at_their_widths():
    p = Payload(shape=torch.Size([1000]), dtype=torch.float32)
    p.add("indices", torch.zeros(7, dtype=torch.int64), 10, "index")  # 7 indices into d=1000 at 10 bits
    p.add("values", torch.zeros(7), 32, "value")
    p.add("codes", torch.zeros(5, dtype=torch.int8), math.log2(3), "code")  # ternary, fractional width
    assert p.bits == math.ceil(7 * 10 + 7 * 32 + 5 * math.log2(3))
    assert p.bits_by_kind() == {"index": 70.0, "value": 224.0, "code": pytest.approx(5 * math.log2(3))}


def test_payload_rejects_duplicate_parts_and_negative_widths():
    p = Payload(shape=torch.Size([4]), dtype=torch.float32)
    p.add("a", torch.zeros(1), 32, "value")
    with pytest.raises(ValueError, match="already has a part"):
        p.add("a", torch.zeros(1), 32, "value")
    with pytest.raises(ValueError, match=">= 0 bits"):
        p.add("b", torch.zeros(1), -1, "value")
    with pytest.raises(KeyError, match="no part 'zz'"):
        p["zz"]


def test_entropy_replaces_only_code_widths():
    p = Payload(shape=torch.Size([8]), dtype=torch.float32)
    p.add("codes", torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]), 8, "code")  # uniform over 4 symbols: 2 bits each
    p.add("scale", torch.zeros(1), 32, "scale")
    assert p.entropy_bits() == pytest.approx(8 * 2 + 32)
    assert p.bits == 8 * 8 + 32


def test_empirical_entropy_of_constant_codes_is_zero():
    assert empirical_entropy(torch.full((100,), 3)) == 0.0


@pytest.mark.parametrize("d,expected", [(1, 1), (2, 1), (3, 2), (1024, 10), (1025, 11)])
def test_index_width_is_ceil_log2_d(d, expected):
    assert index_width(d) == expected
    assert index_width(d, packed=False) == 32


def test_widths_reject_impossible_sizes():
    with pytest.raises(ValueError):
        index_width(0)
    with pytest.raises(ValueError):
        code_width(1)
    assert code_width(3) == 2 and code_width(2) == 1 and code_width(9) == 4


# -- context ------------------------------------------------------------------------------------------------
def test_derived_seeds_are_deterministic_and_distinct():
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    seeds = {Context(seed=0, step=s, worker=w, block=b).call_seed for s in range(5) for w in range(4) for b in range(3)}
    assert len(seeds) == 60


def test_generator_does_not_touch_global_rng():
    before = torch.random.get_rng_state()
    a = torch.rand(5, generator=generator(7, "cpu", 1))
    b = torch.rand(5, generator=generator(7, "cpu", 1))
    assert torch.equal(a, b)
    assert torch.equal(before, torch.random.get_rng_state())


# -- registry -----------------------------------------------------------------------------------------------
def test_spec_round_trip():
    c = create("topk:ratio=0.05,packed=false")
    assert c.ratio == 0.05 and c.packed is False
    assert create(c.spec()).spec() == c.spec()


def test_parse_spec_splits_name_and_arguments():
    assert parse_spec(" qcs : k=64, Q=4 ") == ("qcs", {"k": "64", "Q": "4"})


@pytest.mark.parametrize(
    "spec,message",
    [
        ("nosuch", "unknown compressor 'nosuch'"),
        ("topk:bogus=1", "unknown parameter 'bogus'"),
        ("topk:ratio=abc", "expected float"),
        ("topk:ratio", "expected key=value"),
        ("topk:packed=maybe", "expected a boolean"),
        ("topk:ratio=1.5", r"ratio must lie in \(0, 1\)"),
        ("", "empty compressor spec"),
    ],
)
def test_bad_specs_are_rejected_with_a_clear_message(spec, message):
    with pytest.raises(ValueError, match=message):
        create(spec)


def test_every_registered_compressor_is_listed():
    assert "topk" in compressors.names()


# -- feedback -----------------------------------------------------------------------------------------------
def _run_feedback(fb: ErrorFeedback, grads, compress):
    st = fb.new_state()
    sent = []
    for g in grads:
        z = fb.compensate(g, st)
        zh = compress(z)
        fb.update(z, zh, st)
        sent.append(zh)
    return sent, st.residual


def _half(z):  # a deterministic lossy "compressor": keep the first half of the coordinates
    out = z.clone()
    out[len(z) // 2 :] = 0
    return out


def test_plain_error_feedback_loses_nothing_over_time():
    """With h = z - C(z), sum of what was sent + final residual = sum of gradients (telescoping)."""
    torch.manual_seed(0)
    grads = [torch.randn(10) for _ in range(6)]
    sent, residual = _run_feedback(ErrorFeedback.plain(), grads, _half)
    assert torch.allclose(sum(sent) + residual, sum(grads), atol=1e-5)


def test_qcs_feedback_follows_eq_14():
    """QCS eq. (14a-d): z = g + beta r, r' = (1 - beta) r + (z - zhat), written out by hand for two steps."""
    beta = 0.3
    g1, g2 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])
    sent, r = _run_feedback(ErrorFeedback.qcs(beta), [g1, g2], _half)
    r1 = torch.tensor([0.0, 2.0])  # e_1 = z_1 - C(z_1) with z_1 = g_1
    z2 = g2 + beta * r1  # [3.0, -0.4]
    r2 = (1 - beta) * r1 + (z2 - _half(z2))  # [0, 1.4 - 0.4]
    assert torch.allclose(sent[1], _half(z2))
    assert torch.allclose(r, r2)


def test_ecq_feedback_is_decayed_accumulated_error():
    """ECQ-SGD: h_t = beta h_{t-1} + (g_{t-1} - g~_{t-1}) with g~ = Q(g + alpha h): the error is taken against
    the raw gradient g, not against the compensated input."""
    alpha, beta = 0.5, 0.9
    g1, g2 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])
    sent, h = _run_feedback(ErrorFeedback.ecq(alpha, beta), [g1, g2], _half)
    h1 = g1 - _half(g1)  # h_1 = g_0 - g~_0 (h_0 = 0)
    gt2 = _half(g2 + alpha * h1)
    assert torch.allclose(sent[1], gt2)
    assert torch.allclose(h, beta * h1 + (g2 - gt2))


def test_ecq_with_full_compensation_and_no_decay_loss_is_plain_feedback():
    """alpha = beta = 1 makes ECQ-SGD plain error feedback (h = all past error, fully compensated)."""
    torch.manual_seed(1)
    grads = [torch.randn(8) for _ in range(5)]
    sent_ecq, h_ecq = _run_feedback(ErrorFeedback.ecq(1.0, 1.0), grads, _half)
    sent_ef, h_ef = _run_feedback(ErrorFeedback.plain(), grads, _half)
    assert all(torch.allclose(a, b) for a, b in zip(sent_ecq, sent_ef, strict=True)) and torch.allclose(h_ecq, h_ef)


def test_no_feedback_compresses_the_raw_gradient():
    sent, _ = _run_feedback(ErrorFeedback.none(), [torch.ones(4), torch.ones(4)], _half)
    assert torch.equal(sent[1], _half(torch.ones(4)))


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("none", ErrorFeedback(0.0, 0.0)),
        ("ef", ErrorFeedback(1.0, 0.0)),
        ("qcs:beta=0.25", ErrorFeedback(0.25, 0.75)),
        ("ecq:alpha=1,beta=0.9", ErrorFeedback(1.0, 0.9 - 1.0)),
    ],
)
def test_feedback_specs(spec, expected):
    assert parse_feedback(spec) == expected


@pytest.mark.parametrize("spec", ["qcs:beta=0", "qcs:beta=1.5", "magic", "qcs:gamma=1", "ecq:alpha=x"])
def test_bad_feedback_specs_are_rejected(spec):
    with pytest.raises(ValueError):
        parse_feedback(spec)
