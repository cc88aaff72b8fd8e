"""The CUDA paths of the queued encodes, on a machine without a GPU (tests/_fake_cuda.py: fake CUDA tensors, Triton
launches recorded): each runs to the end without reading a value back, without a CPU tensor in its CUDA work, and
launches the kernels it is meant to (the Triton forms, not their eager fallbacks). The GPU check times them; this
holds the property 'no host synchronisation inside encode' in every CI run."""

from __future__ import annotations

import pytest
import torch
from _fake_cuda import fake_cuda, needs_fake_cuda

import gradstat.compressors  # noqa: F401  (registers every compressor)
from gradstat.compressors.context import Context
from gradstat.compressors.registry import create

SIZE = 2_600_000

READ_FREE = {
    "sidco:ratio=0.001,dist=exp,stages=1": ("triton:_summary_blocks", "triton:_count_blocks", "triton:_write_blocks"),
    "sidco:ratio=0.001,dist=exp,stages=3": ("triton:_tail_blocks", "triton:_write_blocks"),
    "sidco:ratio=0.001,dist=gamma,stages=3": ("triton:_summary_blocks", "triton:_tail_blocks", "triton:_halley"),
    "sidco:ratio=0.001,dist=gp,stages=3": ("triton:_summary_blocks", "triton:_tail_blocks"),
    "dgc:ratio=0.001": ("triton:_rows", "triton:_count_blocks", "triton:_write_blocks"),
    "gmc_topk:ratio=0.001": ("triton:_rows", "triton:_count_blocks"),
    "threshold": ("triton:_count_blocks",),
    "topk:ratio=0.001": ("aten:topk",),
    "randk:ratio=0.001": ("triton:_rows", "triton:_count_blocks", "triton:_write_blocks"),
    "randk_unbiased:ratio=0.001": ("triton:_rows",),
    "qsgd": ("triton:_rows",),
    "terngrad": ("triton:_rows",),
    "dqsg": ("triton:_rows",),
    "ndqsg": ("triton:_rows",),
    "qcs": ("triton:_rows",),
    "ecq": ("triton:_rows",),
    "signsgd": ("triton:_tail_blocks",),
    "onebit": (),
}
"""The encodes the CUDA goals cover, each with kernels its CUDA path must launch."""


@needs_fake_cuda
@pytest.mark.parametrize("spec", sorted(READ_FREE))
def test_the_queued_encode_on_cuda_reads_nothing_back(spec, monkeypatch):
    c = create(spec)
    with fake_cuda(monkeypatch) as fake:
        with fake.mode:
            x = torch.empty(SIZE, device="cuda")
        for step in range(3):  # (a rule that sizes a buffer on its first encode queues from its second)
            with fake.record() as launches:
                pending = c.enqueue(x, Context(seed=3, step=step, state=c.new_state()))
            assert not pending.settled, "the encode ran synchronously"
    missing = [k for k in READ_FREE[spec] if k not in launches]
    assert not missing, (missing, launches)


def _last_encode(spec: str, monkeypatch: pytest.MonkeyPatch, encodes: int = 2) -> tuple[list[str], dict[str, dict]]:
    """The launches of the last of ``encodes`` queued encodes of ``spec`` at SIZE on fake CUDA (device queries left
    out), and each Triton kernel's compile-time constants at its last launch."""
    c = create(spec)
    with fake_cuda(monkeypatch) as fake:
        with fake.mode:
            x = torch.empty(SIZE, device="cuda")
        for step in range(encodes):
            with fake.record() as launches:
                c.enqueue(x, Context(seed=3, step=step, state=c.new_state()))
        return [k for k in launches if k != "aten:device"], dict(fake.constants)


SELECTION = ["triton:_count_blocks", "aten:cumsum", "triton:_write_blocks", "triton:_finish", "aten:cat"]
"""A threshold sparsifier's queued selection once its threshold is known: the count, the blocks' ends, the writes,
the tally with the buffers' padding, and the one vector read back (eleven more launches before the tally kernel)."""
THRESHOLD_FROM = {"exp,stages=1": "compiled:_deferred_stages", "stages=3": "triton:_join_blocks", "dgc": "aten:min"}
"""The launch that leaves each rule's threshold: SIDCo's compiled stages (their last pass's join, with later stages),
DGC's sample minimum; the selection follows it at once (the threshold's conversions happen in the kernels)."""


@needs_fake_cuda
@pytest.mark.parametrize("spec", [s for s in sorted(READ_FREE) if s.startswith(("sidco", "dgc"))])
def test_the_queued_selection_takes_five_launches_after_the_threshold(spec, monkeypatch):
    kernels, _ = _last_encode(spec, monkeypatch)
    start = kernels.index(SELECTION[0])
    assert kernels[start:] == SELECTION, kernels
    before = next(v for k, v in THRESHOLD_FROM.items() if k in spec)
    assert kernels[start - 1] == before, kernels


@needs_fake_cuda
@pytest.mark.parametrize("spec", [s for s in sorted(READ_FREE) if s.startswith("sidco")])
def test_sidco_stores_peaks_in_its_summary_and_its_selection_skips_by_them(spec, monkeypatch):
    """The stage-1 summary's read stores the sub-block maxima of |g| (theory/kernels/peaks.py), and both reads of
    the selection take them: at ratio 1e-3 they read about 3 % of the vector instead of all of it and two thirds."""
    _, constants = _last_encode(spec, monkeypatch)
    assert constants["_summary_blocks"]["PEAKS"] and constants["_summary_blocks"]["SUB"] == 32
    assert constants["_count_blocks"]["PEAKS"] and constants["_write_blocks"]["PEAKS"]
    assert constants["_count_blocks"]["SUB"] == constants["_write_blocks"]["SUB"] == 32


@needs_fake_cuda
def test_a_selection_without_peaks_stores_them_in_its_count_for_its_writes(monkeypatch):
    """DGC's threshold comes from a sample, with no read of the whole gradient before the selection: the count reads
    every element (it also finds the largest magnitude) and stores the sub-block maxima, and the writes skip by
    them."""
    _, constants = _last_encode("dgc:ratio=0.001", monkeypatch)
    count, write = constants["_count_blocks"], constants["_write_blocks"]
    assert count["STORE"] and not count["PEAKS"] and count["EXTREMES"]
    assert write["PEAKS"] and write["SUB"] == count["SUB"] == 32


@needs_fake_cuda
@pytest.mark.parametrize("spec", ["terngrad", "dqsg"])
def test_a_quantizers_queued_encode_fills_its_key_once_and_keeps_its_one_check_as_it_is(spec, monkeypatch):
    """The counter hash's key is one int64 fill (its two int32 words; a stack of two fills before), the scale's
    finiteness one norm reduction and its comparison, and the only deferred check is the answer itself (no stack
    and no all() of one flag)."""
    kernels, _ = _last_encode(spec, monkeypatch, encodes=1)
    assert "aten:stack" not in kernels and "aten:all" not in kernels, kernels
    assert kernels.count("aten:linalg_vector_norm") == 1 and "aten:ones_like" not in kernels, kernels
    assert kernels[-1] == "triton:_rows", kernels
