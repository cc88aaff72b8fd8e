"""The selections' Triton forms: kernels over blocks, compiled for CUDA tensors and interpreted for CPU ones.

:func:`select` writes the first ``capacity`` increasing indices of ``v_i >= t`` (``v = |x|`` or ``x``; ``t`` the
threshold read inside the kernels from its 0-d tensor, rounded to x's dtype and raised to its smallest positive value
there, as :func:`~gradstat.theory.kernels.primitives.positive_threshold` does it) and ``x`` there into buffers of that
fixed size, and returns how many elements the rule selects as a 0-d device tensor, so that nothing waits for the
host:

1. ``_count_blocks``: one program per block of ``BLOCK`` elements stores how many of them are selected (and, with
   ``EXTREMES``, the block's largest magnitude). Given the vector's sub-block maxima from an earlier read
   (:mod:`gradstat.theory.kernels.peaks`), it leaves unread the sub-blocks whose maximum lies below the threshold;
   without them it reads every element and stores them;
2. the blocks' inclusive ends are the cumulative sum of those counts (one small torch ``cumsum`` on the device), and
   the last is the count;
3. ``_write_blocks``: each program reads its block again (only its sub-blocks that can hold a selected element:
   at ratio 1e-3, 3 % of them; the exact selection's writes too), numbers its selected elements in order (an
   inclusive scan of the hit mask), and writes index and value at its block's first position (its end less its
   count) plus that number, where the position is below ``capacity``; with ``TIES`` it also stores the smallest
   magnitude it wrote and how many of its writes equal it;
4. ``_finish``: its first program joins the blocks' partials into the *tally* ``[largest |x|, count, ties]``
   (float64: what a queued encode reads back, ``ties`` being how many written magnitudes equal the smallest written
   one); the others fill the buffers past the written prefix with -1 and 0.

The eager form took eleven more launches for the same (the threshold's two conversions, the buffers' two fills, the
starts' subtraction, the largest magnitude's reduction, and seven operations for the tie count): small kernels whose
launch and tail cost more than their work, on a GPU, at every size.

The sums and the scan combine with Triton's own ``_sum_combine`` through ``tl.reduce`` and ``tl.associative_scan``
(what ``tl.sum`` and ``tl.cumsum`` call), builtins the interpreter always replaces.

:func:`select_exact` is the exact selection (every selected index, the output sized by the count): the first and
third kernels, the first one also storing each block's largest magnitude (``EXTREMES``), with one read back of the
total and the maximum between them. How the kernels are built for each device, and the import of Triton on first
use, are :mod:`gradstat.theory.kernels.triton_runtime`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gradstat.theory.kernels import triton_runtime
from gradstat.theory.kernels.peaks import Peaks, sub_for
from gradstat.theory.kernels.triton_runtime import available

__all__ = ["BLOCK", "Counted", "available", "build", "count_exact", "select", "select_exact"]

tl: Any = None
"""``triton.language``, bound by :func:`gradstat.theory.kernels.triton_runtime.build` (the kernels read it as a
global, as Triton requires)."""

BLOCK = 1024
"""Elements per program on CUDA (a power of two: ``tl.arange``'s requirement)."""


# The kernels' arguments are annotated as Triton reads them (tl.constexpr marks a compile-time constant), not for mypy.


def _count_blocks(  # type: ignore[no-untyped-def]
    x_ptr, t_ptr, counts_ptr, tops_ptr, peaks_ptr, n, n_peaks, SIGNED: tl.constexpr, EXTREMES: tl.constexpr,
    WIDE: tl.constexpr, PEAKS: tl.constexpr, STORE: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``counts[b]``: how many of block b's elements are selected; with EXTREMES also ``tops[b]``, the block's
    largest magnitude (+inf where it holds a NaN or an infinity: the finiteness check rides on the same read).
    WIDE: x is float64. PEAKS: the sub-blocks of SUB elements whose ``peaks`` lie below the threshold are not read
    (none of their elements is selected; never with EXTREMES). STORE (not with PEAKS): every element is read, and
    each sub-block's peak stored into ``peaks`` for the writes to skip by."""
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # the threshold in x's dtype (rounded to nearest), at least its smallest positive value (a subnormal, made from
    # its bits: a float literal would be float32); NaN kept (it selects nothing), as positive_threshold does
    if WIDE:
        tiny = tl.full((), 1, tl.int64).to(tl.float64, bitcast=True)
        t = tl.load(t_ptr).to(tl.float64)
    else:
        tiny = tl.full((), 1, tl.int32).to(tl.float32, bitcast=True)
        t = tl.load(t_ptr).to(tl.float32)
    t = tl.where(t < tiny, tiny, t)
    inside = offsets < n
    if PEAKS:
        subs = block.to(tl.int64) * (BLOCK // SUB) + tl.arange(0, BLOCK // SUB)
        live = tl.load(peaks_ptr + subs, mask=subs < n_peaks, other=0.0) >= t
        inside = inside & tl.reshape(tl.broadcast_to(live[:, None], (BLOCK // SUB, SUB)), (BLOCK,))
    v = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    hit = ((tl.abs(v) if SIGNED else v) >= t) & inside
    tl.store(counts_ptr + block, tl.reduce(hit.to(tl.int64), 0, tl.standard._sum_combine))
    if STORE:
        a = tl.abs(v)
        marked = tl.where((a - a) != 0, float("inf"), a)  # (NaN or an infinity: inf - inf is NaN)
        peak = tl.reduce(tl.reshape(marked, (BLOCK // SUB, SUB)), 1, tl.standard._elementwise_max)
        subs = block.to(tl.int64) * (BLOCK // SUB) + tl.arange(0, BLOCK // SUB)
        tl.store(peaks_ptr + subs, peak, mask=subs < n_peaks)
    if EXTREMES:
        a = tl.abs(v)
        bad = (a - a) != 0  # NaN or an infinity (inf - inf is NaN)
        top = tl.reduce(tl.where(bad, 0.0, a), 0, tl.standard._elementwise_max)
        nonfinite = tl.reduce(bad.to(tl.int32), 0, tl.standard._sum_combine)
        tl.store(tops_ptr + block, tl.where(nonfinite > 0, float("inf"), top))


def _write_blocks(  # type: ignore[no-untyped-def]
    x_ptr, t_ptr, ends_ptr, counts_ptr, indices_ptr, values_ptr, lows_ptr, tied_ptr, peaks_ptr, n, n_peaks, capacity,
    SIGNED: tl.constexpr, WIDE: tl.constexpr, TIES: tl.constexpr, PEAKS: tl.constexpr, SUB: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Block b's selected indices and values, in order, from output position ``ends[b] - counts[b]``, below
    ``capacity``; with TIES, ``lows[b]``, the smallest magnitude it wrote (+inf: none), and ``tied[b]``, how many of
    its writes equal it. A block with nothing to write (none selected, ``counts[b] = 0``, or its start past the
    capacity) returns before reading ``x``: at ratio 1e-3 about a third of the blocks of 1024 elements. The ranks
    within a block are int32 (at most ``BLOCK``): half the scan of int64."""
    block = tl.program_id(0)
    count = tl.load(counts_ptr + block)
    start = tl.load(ends_ptr + block) - count
    if (count == 0) | (start >= capacity):
        if TIES:
            tl.store(lows_ptr + block, float("inf"))
            tl.store(tied_ptr + block, 0)
        return
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if WIDE:  # (the threshold as _count_blocks takes it, and its sub-blocks skipped alike)
        tiny = tl.full((), 1, tl.int64).to(tl.float64, bitcast=True)
        t = tl.load(t_ptr).to(tl.float64)
    else:
        tiny = tl.full((), 1, tl.int32).to(tl.float32, bitcast=True)
        t = tl.load(t_ptr).to(tl.float32)
    t = tl.where(t < tiny, tiny, t)
    inside = offsets < n
    if PEAKS:
        subs = block.to(tl.int64) * (BLOCK // SUB) + tl.arange(0, BLOCK // SUB)
        live = tl.load(peaks_ptr + subs, mask=subs < n_peaks, other=0.0) >= t
        inside = inside & tl.reshape(tl.broadcast_to(live[:, None], (BLOCK // SUB, SUB)), (BLOCK,))
    v = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    hit = ((tl.abs(v) if SIGNED else v) >= t) & inside
    rank = tl.associative_scan(hit.to(tl.int32), 0, tl.standard._sum_combine)
    position = start + rank.to(tl.int64) - 1
    keep = hit & (position < capacity)
    tl.store(indices_ptr + position, offsets, mask=keep)
    tl.store(values_ptr + position, v, mask=keep)
    if TIES:
        a = tl.abs(v)
        low = tl.reduce(tl.where(keep, a, float("inf")), 0, tl.standard._elementwise_min)
        tl.store(lows_ptr + block, low)
        tl.store(tied_ptr + block, tl.reduce((keep & (a == low)).to(tl.int32), 0, tl.standard._sum_combine))


def _finish(  # type: ignore[no-untyped-def]
    ends_ptr, tops_ptr, lows_ptr, tied_ptr, indices_ptr, values_ptr, tally_ptr, blocks, capacity,
    EXTREMES: tl.constexpr, TIES: tl.constexpr, CHUNK: tl.constexpr, STEPS: tl.constexpr, FILL: tl.constexpr,
):  # fmt: skip
    """Program 0: the tally ``[largest |x| (NaN without EXTREMES), count, ties (0 without TIES)]`` in float64, from
    the blocks' partials (the largest of ``tops``; the smallest of ``lows``, and the sum of ``tied`` over the blocks
    whose low it is, both kept per lane as a running minimum and its count). Program p >= 1: the positions of
    ``[(p - 1) FILL, p FILL)`` at or past the written prefix ``min(count, capacity)`` get index -1 and value 0."""
    program = tl.program_id(0)
    count = tl.load(ends_ptr + blocks - 1)
    if program == 0:
        top = tl.full((CHUNK,), float("-inf"), tl.float64)
        low = tl.full((CHUNK,), float("inf"), tl.float64)
        tied = tl.full((CHUNK,), 0, tl.int64)
        for step in range(STEPS):  # (a constant count: Triton 3.6's interpreter cannot loop to a runtime bound)
            rows = step * CHUNK + tl.arange(0, CHUNK)
            used = rows < blocks
            if EXTREMES:
                top = tl.maximum(top, tl.load(tops_ptr + rows, mask=used, other=float("-inf")).to(tl.float64))
            if TIES:
                lows = tl.load(lows_ptr + rows, mask=used, other=float("inf")).to(tl.float64)
                ties = tl.load(tied_ptr + rows, mask=used, other=0).to(tl.int64)
                tied = tl.where(lows < low, ties, tl.where(lows == low, tied + ties, tied))
                low = tl.minimum(low, lows)
        if EXTREMES:
            tl.store(tally_ptr + 0, tl.reduce(top, 0, tl.standard._elementwise_max))
        else:
            tl.store(tally_ptr + 0, float("nan"))
        tl.store(tally_ptr + 1, count.to(tl.float64))
        if TIES:
            smallest = tl.reduce(low, 0, tl.standard._elementwise_min)
            ties_at = tl.reduce(tl.where(low == smallest, tied, 0), 0, tl.standard._sum_combine)
            tl.store(tally_ptr + 2, ties_at.to(tl.float64))
        else:
            tl.store(tally_ptr + 2, 0.0)
    else:
        written = tl.minimum(count, capacity)
        offsets = (program - 1).to(tl.int64) * FILL + tl.arange(0, FILL)
        pad = (offsets >= written) & (offsets < capacity)
        tl.store(indices_ptr + offsets, tl.full((FILL,), -1, tl.int64), mask=pad)
        tl.store(values_ptr + offsets, tl.full((FILL,), 0.0, tl.float32), mask=pad)


def build(interpret: bool) -> tuple[Any, Any]:
    """The count and write kernels, interpreted (for CPU tensors) or for compilation on CUDA. Raises ImportError
    where Triton is not installed."""
    return triton_runtime.build(_count_blocks, interpret), triton_runtime.build(_write_blocks, interpret)


CHUNK = 2048
"""Partials the finishing program joins per step on CUDA (25,391 blocks at 26M elements: 13 steps, run as 16: the
step count is rounded up to a power of two, the last three masked)."""
FILL = 1024
"""Buffer positions each filling program pads on CUDA."""


def select(
    x: torch.Tensor,
    threshold: torch.Tensor,
    signed: bool,
    capacity: int,
    extremes: bool = False,
    ties: bool = False,
    peaks: Peaks | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(indices, values, count, tally)`` of the selection ``v >= t`` (``v = |x|`` when ``signed``, else ``x``) of
    the 1-D float32 or float64 ``x``: the first ``capacity`` selected indices in increasing order (int64, then -1),
    ``x`` there (then 0), the number selected (0-d int64) and the tally, float64 ``[largest |x|, count, ties]``
    (:class:`~gradstat.theory.kernels.bounded.Bounded`; the largest +inf where ``x`` holds a NaN or an infinity, and
    NaN without ``extremes``; ties 0 without ``ties``); all on ``x``'s device, nothing read back to the host.
    ``threshold``: a 0-d floating tensor on x's device, ``t`` being it in x's dtype raised to the smallest positive
    value (zeros are never selected; NaN selects nothing). ``peaks``: x's sub-block maxima
    (:mod:`gradstat.theory.kernels.peaks`), whose sub-blocks below ``t`` the count and the writes do not read (the
    result is the same); not with ``extremes``, whose largest magnitude needs every element read. Without them the
    count reads every element and stores them, for the writes. Four launches (three with no room: ``capacity``
    0)."""
    count_kernel, write_kernel = build(interpret=x.device.type == "cpu")
    finish_kernel = triton_runtime.build(_finish, interpret=x.device.type == "cpu")
    x = x.contiguous()
    n = x.numel()
    if n == 0:
        indices = torch.full((capacity,), -1, dtype=torch.int64, device=x.device)
        values = torch.zeros(capacity, dtype=x.dtype, device=x.device)
        tally = torch.zeros(3, dtype=torch.float64, device=x.device)
        if not extremes:
            tally[0] = float("nan")
        return indices, values, torch.zeros((), dtype=torch.int64, device=x.device), tally
    indices = torch.empty(capacity, dtype=torch.int64, device=x.device)
    values = torch.empty(capacity, dtype=x.dtype, device=x.device)
    block = triton_runtime.block_for(x, BLOCK)
    if peaks is not None:
        if extremes:
            raise ValueError("select: peaks skip elements, and the largest magnitude (extremes) needs them all")
        peaks.check(x, block)
    blocks = -(-n // block)
    counts = torch.empty(blocks, dtype=torch.int64, device=x.device)
    tops = torch.empty(blocks, dtype=x.dtype, device=x.device) if extremes else counts
    # without peaks, the count's read stores them (a thirty-second of x's bytes on CUDA), and the writes skip by them
    found = peaks if peaks is not None else Peaks(torch.empty(-(-n // sub_for(x)), dtype=x.dtype, device=x.device),
                                                  sub_for(x))  # fmt: skip
    counting = {"PEAKS": peaks is not None, "STORE": peaks is None and capacity > 0, "SUB": found.sub}
    writing = {"PEAKS": True, "SUB": found.sub}
    maxima, n_peaks = found.values, found.values.numel()
    ties = ties and capacity > 0  # (nothing written: no ties)
    lows = torch.empty(blocks, dtype=x.dtype, device=x.device) if ties else counts
    tied = torch.empty(blocks, dtype=torch.int32, device=x.device) if ties else counts
    tally = torch.empty(3, dtype=torch.float64, device=x.device)
    wide = x.dtype == torch.float64
    chunk, steps = triton_runtime.finishing_steps(blocks, x, CHUNK)
    fill = triton_runtime.block_for(x, FILL, capacity)  # (positions per padding program)
    context, options = triton_runtime.launch(x)
    with context:
        count_kernel[(blocks,)](x, threshold, counts, tops, maxima, n, n_peaks, SIGNED=signed, EXTREMES=extremes,
                                WIDE=wide, BLOCK=block, **counting, **options)  # fmt: skip
        ends = torch.cumsum(counts, 0)
        if capacity:
            write_kernel[(blocks,)](
                x, threshold, ends, counts, indices, values, lows, tied, maxima, n, n_peaks, capacity, SIGNED=signed,
                WIDE=wide, TIES=ties, BLOCK=block, **writing, **options,
            )  # fmt: skip
        finish_kernel[(1 + -(-capacity // fill),)](
            ends, tops, lows, tied, indices, values, tally, blocks, capacity, EXTREMES=extremes, TIES=ties,
            CHUNK=chunk, STEPS=steps, FILL=fill, **options,
        )  # fmt: skip
    return indices, values, ends[-1], tally


def select_exact(
    x: torch.Tensor, t: torch.Tensor, signed: bool, extremes: bool
) -> tuple[torch.Tensor, torch.Tensor, float | None]:
    """``(indices, values, top)``: every index of the selection ``v >= t`` (``v = |x|`` when ``signed``) of the 1-D
    float32 or float64 ``x``, increasing (int64), ``x`` there, and with ``extremes`` the largest ``|x|`` (+inf where
    ``x`` holds a NaN or an infinity; else None), in two reads of ``x``: the counts (and block maxima), then the
    writes, with one read back between them (the count, which sizes the output, and the maximum, in one copy).
    ``t``: as for :func:`select`. :func:`count_exact` then :meth:`Counted.finish`."""
    return count_exact(x, t, signed, extremes).finish()


def count_exact(x: torch.Tensor, t: torch.Tensor, signed: bool, extremes: bool) -> Counted:
    """The first half of :func:`select_exact`: the counts per block (and block maxima) launched, nothing read back;
    :meth:`Counted.finish` reads the total and writes the selection (a queued encode finishes when it sends)."""
    x = x.contiguous()
    n = x.numel()
    block = triton_runtime.block_for(x, BLOCK)
    blocks = -(-n // block)
    found = Peaks(torch.empty(-(-n // sub_for(x)), dtype=x.dtype, device=x.device), sub_for(x))
    if not n:  # (nothing to count: a zero total, and a zero largest magnitude)
        counts = torch.zeros(1, dtype=torch.int64, device=x.device)
        ends = torch.cumsum(counts, 0)
        read = torch.zeros(3, dtype=torch.float64, device=x.device) if extremes else ends[-1:]
        return Counted(x, t, signed, block, counts, ends, read, extremes, found)
    counts = torch.empty(blocks, dtype=torch.int64, device=x.device)  # (every block's entry is written)
    tops = torch.empty(blocks, dtype=x.dtype, device=x.device) if extremes else counts
    count_kernel, _ = build(interpret=x.device.type == "cpu")
    context, options = triton_runtime.launch(x)
    with context:
        count_kernel[(blocks,)](
            x, t, counts, tops, found.values, n, found.values.numel(), SIGNED=signed, EXTREMES=extremes,
            WIDE=x.dtype == torch.float64, PEAKS=False, STORE=True, SUB=found.sub, BLOCK=block, **options,
        )  # fmt: skip
        ends = torch.cumsum(counts, 0)
        if extremes:  # the tally [largest |x|, total, 0] by the finishing program alone (no buffer to pad)
            read = torch.empty(3, dtype=torch.float64, device=x.device)
            chunk, steps = triton_runtime.finishing_steps(blocks, x, CHUNK)
            triton_runtime.build(_finish, interpret=x.device.type == "cpu")[(1,)](
                ends, tops, counts, counts, counts, counts, read, blocks, 0, EXTREMES=True, TIES=False, CHUNK=chunk,
                STEPS=steps, FILL=triton_runtime.INTERPRETED_BLOCK, **options,
            )  # fmt: skip
        else:
            read = ends[-1:]
    return Counted(x, t, signed, block, counts, ends, read, extremes, found)


@dataclass(frozen=True)
class Counted:
    """A selection counted on the device (:func:`count_exact`): ``read`` holds its total for one read back (with
    ``extremes``, the tally ``[largest |x|, total, 0]``, float64)."""

    x: torch.Tensor
    t: torch.Tensor
    signed: bool
    block: int
    counts: torch.Tensor
    ends: torch.Tensor
    read: torch.Tensor
    extremes: bool
    peaks: Peaks
    """x's sub-block maxima, stored by the count's read: the writes skip the sub-blocks below the threshold."""

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, float | None]:
        """Read the total back (one copy, with the maximum), then write the selection: :func:`select_exact`'s
        result."""
        values_read = self.read.tolist()  # the one host read: the output's size (with extremes, the tally)
        total = int(values_read[1] if self.extremes else values_read[0])
        x = self.x
        indices = torch.empty(total, dtype=torch.int64, device=x.device)
        values = torch.empty(total, dtype=x.dtype, device=x.device)
        if total:
            _, write_kernel = build(interpret=x.device.type == "cpu")
            context, options = triton_runtime.launch(x)
            grid = (-(-x.numel() // self.block),)
            with context:
                write_kernel[grid](
                    x, self.t, self.ends, self.counts, indices, values, self.counts, self.counts, self.peaks.values,
                    x.numel(), self.peaks.values.numel(), total, SIGNED=self.signed, WIDE=x.dtype == torch.float64,
                    TIES=False, PEAKS=True, SUB=self.peaks.sub, BLOCK=self.block, **options,
                )  # fmt: skip
        return indices, values, (float(values_read[0]) if self.extremes else None)
