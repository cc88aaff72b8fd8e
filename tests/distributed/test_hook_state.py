"""Pieces of the DDP hooks that need no process group: side-information decoding order, checkpointing of
compressor states, bucket-state bookkeeping."""

from __future__ import annotations

import io

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.ddp import make_hook
from gradstat.compressors.ddp.state import CompressionHookState, HookSettings
from gradstat.compressors.schemes.sparsifiers.sidco import SIDCoState


def test_side_information_decoding_follows_algorithm_2():
    # NDQSG with p1 = 2 of 5 ranks: decode_all (what every rank's hook does with the gathered payloads) must give
    # exactly NDQSG.round's reconstructions (P1 averaged first, then each P2 rank with the running average)
    comp = compressors.create("ndqsg:p1=2")
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(3000, generator=gen)
    grads = [base + 0.05 * torch.randn(3000, generator=gen) for _ in range(5)]
    ctx = Context(seed=4, step=7, block=1)
    expected = comp.round(grads, ctx)
    got = comp.decode_all([comp.encode(g, ctx.but(worker=w)) for w, g in enumerate(grads)], ctx)
    for a, b in zip(got, expected.decoded, strict=True):
        assert torch.equal(a, b)
    # decoding the P2 ranks with the wrong side information gives something else: the order matters
    wrong = comp.decode(comp.encode(grads[4], ctx.but(worker=4)), ctx.but(worker=4), side=torch.zeros(3000))
    assert not torch.equal(wrong, got[4])


def test_compressor_states_checkpoint_through_weights_only_torch_save():
    state, _ = make_hook("sidco:ratio=0.01", "ef")
    b = state.memory.bucket_state((0, 1), [(10,), (5,)], 1, step=0, granularity_layer=False)
    b.blocks[0].feedback.residual = torch.arange(15.0)
    b.blocks[0].compressor.stages = 3
    b.blocks[0].compressor.history.append((2, 0.9))
    state.memory.step = 9
    buf = io.BytesIO()
    torch.save(state.state_dict(), buf)
    fresh, _ = make_hook("sidco:ratio=0.01", "ef")
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    got = fresh.memory.buckets[(0, 1)].blocks[0]
    assert fresh.memory.step == 9 and torch.equal(got.feedback.residual, torch.arange(15.0))
    assert isinstance(got.compressor, SIDCoState) and got.compressor.stages == 3
    assert (
        list(got.compressor.history) == [(2, 0.9)]
        and got.compressor.history.maxlen == b.blocks[0].compressor.history.maxlen
    )


def test_loading_a_state_of_another_compressor_is_refused():
    state, _ = make_hook("topk:ratio=0.01", "ef")
    other, _ = make_hook("topk:ratio=0.02", "ef")
    try:
        other.load_state_dict(state.state_dict())
    except ValueError as exc:
        assert "compressor" in str(exc)
    else:
        raise AssertionError("a state saved for another compressor was accepted")


def test_a_new_partition_carries_each_parameters_residual_and_renews_compressor_state():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))  # parameters of 6, 2, 2, 1
    state = CompressionHookState(
        HookSettings(compressors.create("sidco:ratio=0.1"), compressors.parse_memory("ef"))
    ).bind(model)
    first = state.memory.bucket_state((0, 1), [(2, 3), (2,)], 1, step=0, granularity_layer=False)
    first.blocks[0].feedback.residual = torch.arange(8.0)
    first.blocks[0].compressor.stages = 4
    second = state.memory.bucket_state((2, 3), [(1, 2), (1,)], 1, step=0, granularity_layer=False)
    second.blocks[0].feedback.residual = torch.arange(100.0, 103.0)
    # DDP rebuilds: one bucket (3, 2, 1, 0) -- a new partition, in reverse order
    merged = state.memory.bucket_state((3, 2, 1, 0), [(1,), (1, 2), (2,), (2, 3)], 1, step=1, granularity_layer=False)
    assert torch.equal(merged.blocks[0].feedback.residual, torch.tensor([102.0, 100, 101, 6, 7, 0, 1, 2, 3, 4, 5]))
    assert merged.blocks[0].compressor.stages == 1  # fresh SIDCo state
    assert state.memory.rebuilds == 1
    state.memory.end_step(2)
    assert list(state.memory.buckets) == [(0, 1, 2, 3)]
    # the same parameters in another order keep their state, residual re-sliced
    again = state.memory.bucket_state((0, 1, 2, 3), [(2, 3), (2,), (1, 2), (1,)], 1, step=2, granularity_layer=False)
    assert again is merged and torch.equal(again.residual_of(0), torch.arange(6.0).reshape(2, 3))
    assert state.memory.rebuilds == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"compressor": "topk", "granularity": "tensor"}, "granularity must be 'bucket' or 'layer'"),
        ({"compressor": "topk", "exchange": "broadcast"}, "exchange must be 'gather' or 'allreduce'"),
        ({"compressor": None, "feedback": "ef"}, "need a compressor"),
        ({"compressor": None, "feedback": "dgc:momentum=0.9"}, "need a compressor"),
        ({"compressor": "ndqsg", "exchange": "allreduce"}, "needs exchange='gather'"),
        ({"compressor": "topk", "feedback": "dgc:momentum=0.9,masking=sometimes"}, "expected a boolean"),
        ({"compressor": "topk", "seed": 1.5}, "seed must be an integer"),
    ],
)
def test_bad_hook_settings_are_refused_with_a_clear_error(kwargs, message):
    compressor = kwargs.pop("compressor")
    with pytest.raises(ValueError, match=message):
        make_hook(compressor, kwargs.pop("feedback", "none"), **kwargs)


def test_the_hook_state_keeps_settings_memories_metrics_and_taps_apart():
    state, _ = make_hook("topk:ratio=0.01", "dgc:momentum=0.5,masking=false", seed=3, keep_payloads=True)
    assert state.settings.memory == compressors.parse_memory("dgc:momentum=0.5,masking=false")
    assert state.settings.seed == 3 and state.taps.keep_payloads and not state.taps.observers
    b = state.memory.bucket_state((0,), [(4,)], 1, step=0, granularity_layer=False)
    b.blocks[0].velocity = torch.ones(4)
    state.metrics.bits += 7
    assert state.take_metrics().bits == 7 and state.metrics.bits == 0
    saved = state.state_dict()
    assert saved["momentum"] == 0.5 and saved["masking"] is False and saved["seed"] == 3
    other, _ = make_hook("topk:ratio=0.01", "dgc:momentum=0.5")  # masking on: another memory
    with pytest.raises(ValueError, match="masking"):
        other.load_state_dict(saved)
    same, _ = make_hook("topk:ratio=0.01", "dgc:momentum=0.5,masking=false")
    same.load_state_dict(saved)
    assert same.settings.seed == 3 and torch.equal(same.memory.buckets[(0,)].blocks[0].velocity, torch.ones(4))
