"""The send step written once (compressors/memory/send.py): its memories, its two halves, its failure, its specs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from _sparse_checks import laplace

from gradstat import compressors
from gradstat.compressors import Context, ErrorFeedback, Memory, parse_feedback, parse_memory
from gradstat.compressors.memory.send import WorkerState, feedback_round, send_locally, send_step
from gradstat.compressors.memory.velocity import LocalMomentum

ROOT = Path(__file__).resolve().parents[2]


def test_dgc_memory_follows_the_paper_step_by_step():
    """DGC (Lin et al. 2018) Sec. 3.2-3.3 written out by hand for top-1 of 4 coordinates, three steps:
    u <- m u + g; v <- v + u; send top-1 of v; v <- v - sent; u <- u * (sent == 0)."""
    m = 0.5
    memory = parse_memory(f"dgc:momentum={m}")
    comp = compressors.create("topk:ratio=0.25")
    state = memory.new_states(comp, 1)[0]
    grads = [torch.tensor([1.0, -2.0, 0.5, 0.25]), torch.tensor([0.5, 1.0, -3.0, 0.0]), torch.tensor([2.0, 0, 0, 1])]
    u, v = torch.zeros(4), torch.zeros(4)
    for t, g in enumerate(grads):
        u = m * u + g
        v = v + u
        keep = torch.zeros(4)
        keep[v.abs().argmax()] = 1.0
        sent_ref = v * keep
        v = v - sent_ref
        u = u * (1 - keep)
        _, sent = send_step(comp, memory, g, state, Context(step=t))
        assert torch.equal(sent, sent_ref), t
        assert torch.equal(state.feedback.residual, v) and torch.equal(state.velocity, u), t


def test_masking_off_keeps_the_velocity():
    memory = parse_memory("dgc:momentum=0.9,masking=false")
    comp = compressors.create("topk:ratio=0.25")
    state = memory.new_states(comp, 1)[0]
    g = torch.tensor([4.0, 1.0, 2.0, 3.0])
    send_step(comp, memory, g, state)
    assert torch.equal(state.velocity, g)  # with masking the first coordinate would be zero


def test_a_failed_step_leaves_every_memory_as_it_was():
    # one good step, then a step whose second block is not finite: nothing of the failed step may be kept
    memory = parse_memory("dgc:momentum=0.9")
    comp = compressors.create("topk:ratio=0.1")
    states = memory.new_states(comp, 2)
    ctxs = [Context(block=0), Context(block=1)]
    send_locally(comp, memory, [laplace(100, 1), laplace(100, 2)], states, ctxs)
    before = [(s.feedback.residual.clone(), s.velocity.clone()) for s in states]
    bad = laplace(100, 4)
    bad[7] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        send_locally(comp, memory, [laplace(100, 3), bad], states, ctxs)
    for (r, u), s in zip(before, states, strict=True):
        assert torch.equal(s.feedback.residual, r) and torch.equal(s.velocity, u)


def test_a_round_lands_each_workers_own_reconstruction():
    # plain error feedback: after the round, residual_w = z_w - z_hat_w exactly, with z_w = g_w on the first step
    comp = compressors.create("qsgd")
    states = Memory(ErrorFeedback.plain()).new_states(comp, 3)
    grads = [laplace(200, k) for k in range(3)]
    result = feedback_round(comp, ErrorFeedback.plain(), grads, states, Context(seed=3))
    for g, z_hat, s in zip(grads, result.decoded, states, strict=True):
        assert torch.equal(s.feedback.residual, g.float() - z_hat.float())


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("none", Memory(ErrorFeedback.none())),
        (" ef ", Memory(ErrorFeedback.plain())),
        ("qcs:beta=0.25", Memory(ErrorFeedback(0.25, 0.75))),
        ("ecq: alpha=1 , beta=0.9", Memory(ErrorFeedback.ecq(1.0, 0.9))),
        ("dgc", Memory(ErrorFeedback.plain(), LocalMomentum(0.9, True))),
        ("dgc:momentum=0.5,masking=off", Memory(ErrorFeedback.plain(), LocalMomentum(0.5, False))),
    ],
)
def test_memory_specs(spec, expected):
    assert parse_memory(spec) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty feedback spec"),
        (":beta=1", "no name"),
        ("qcs:beta", "expected key=value"),
        ("qcs:beta=0.1,beta=0.2", "duplicate parameter 'beta'"),
        ("qcs:beta=high", "expected float"),
        ("qcs:alpha=1", "takes"),
        ("bogus", "unknown feedback 'bogus'"),
        ("dgc:momentum=1", r"DGC momentum must lie in \[0, 1\)"),
        ("dgc:momentum=nan", r"DGC momentum must lie in \[0, 1\)"),
        ("dgc:masking=maybe", "expected a boolean"),
        ("dgc:beta=0.9", "unknown parameter"),
        ("weighted:compensation=2,decay=0", r"compensation weight must lie in \[0, 1\]"),
    ],
)
def test_bad_memory_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_memory(spec)


def test_feedback_alone_refuses_dgc_saying_where_it_is_accepted():
    with pytest.raises(ValueError, match="DGC's local momentum"):
        parse_feedback("dgc:momentum=0.9")


def test_memory_of_refuses_other_types():
    with pytest.raises(TypeError, match="Memory, an ErrorFeedback or a spec"):
        Memory.of(0.5)  # type: ignore[arg-type]


def test_compressor_and_memory_specs_share_one_grammar():
    # the same malformed item gives the same complaint from both readers
    with pytest.raises(ValueError, match="expected key=value"):
        compressors.create("topk:ratio")
    with pytest.raises(ValueError, match="expected key=value"):
        parse_memory("ecq:alpha")


def test_no_second_copy_of_the_send_step_in_the_package():
    # compensate and the memory update are called together only by the send step's module
    pattern = re.compile(r"\.compensate\(")
    found = [
        str(p.relative_to(ROOT))
        for layer in ("theory", "compressors", "analysis")
        for p in (ROOT / layer).rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert found == ["compressors/memory/send.py"], found


def test_worker_state_carries_what_the_step_needs():
    s = WorkerState()
    assert s.feedback.residual is None and s.velocity is None and s.compressor is None


def test_the_velocity_is_not_a_view_of_the_gradient():
    # the DDP hook's gradient is a view of the bucket, which DDP overwrites with the average: a velocity kept as that
    # view (masking off, first step) would turn into the next step's gradient
    memory = parse_memory("dgc:momentum=0.5,masking=false")
    comp = compressors.create("topk:ratio=0.25")
    state = memory.new_states(comp, 1)[0]
    bucket = torch.tensor([4.0, 1.0, 2.0, 3.0])
    send_step(comp, memory, bucket, state)
    bucket.fill_(-1.0)
    assert torch.equal(state.velocity, torch.tensor([4.0, 1.0, 2.0, 3.0]))
