"""The selections' Triton forms: two kernels over blocks, compiled for CUDA tensors and interpreted for CPU ones.

:func:`select` writes the first ``capacity`` increasing indices of ``v_i >= t`` (``v = |x|`` or ``x``, ``t`` read
inside the kernels from its 0-d tensor) and ``x`` there into buffers of that fixed size, and returns how many
elements the rule selects as a 0-d device tensor, so that nothing waits for the host:

1. ``_count_blocks``: one program per block of ``BLOCK`` elements stores how many of them are selected;
2. the blocks' first output positions are the exclusive cumulative sum of those counts (one small torch ``cumsum``
   on the device), and the total is the count;
3. ``_write_blocks``: each program reads its block again, numbers its selected elements in order (an inclusive scan
   of the hit mask), and writes index and value at its block's first position plus that number, where the
   position is below ``capacity``.

The sums and the scan combine with Triton's own ``_sum_combine`` through ``tl.reduce`` and ``tl.associative_scan``
(what ``tl.sum`` and ``tl.cumsum`` call), builtins the interpreter always replaces.

:func:`select_exact` is the exact selection (every selected index, the output sized by the count): the same two
kernels, the first one also storing each block's largest magnitude (``EXTREMES``), with one read back of the total
and the maximum between them. How the kernels are built for
each device, and the import of Triton on first use, are :mod:`gradstat.theory.kernels.triton_runtime`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gradstat.theory.kernels import triton_runtime
from gradstat.theory.kernels.triton_runtime import available

__all__ = ["BLOCK", "Counted", "available", "build", "count_exact", "select", "select_exact"]

tl: Any = None
"""``triton.language``, bound by :func:`gradstat.theory.kernels.triton_runtime.build` (the kernels read it as a
global, as Triton requires)."""

BLOCK = 1024
"""Elements per program on CUDA (a power of two: ``tl.arange``'s requirement)."""


# The kernels' arguments are annotated as Triton reads them (tl.constexpr marks a compile-time constant), not for mypy.


def _count_blocks(  # type: ignore[no-untyped-def]
    x_ptr, t_ptr, counts_ptr, tops_ptr, n, SIGNED: tl.constexpr, EXTREMES: tl.constexpr, BLOCK: tl.constexpr
):
    """``counts[b]``: how many of block b's elements are selected; with EXTREMES also ``tops[b]``, the block's
    largest magnitude (+inf where it holds a NaN or an infinity: the finiteness check rides on the same read)."""
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    v = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    hit = ((tl.abs(v) if SIGNED else v) >= tl.load(t_ptr)) & inside
    tl.store(counts_ptr + block, tl.reduce(hit.to(tl.int64), 0, tl.standard._sum_combine))
    if EXTREMES:
        a = tl.abs(v)
        bad = (a - a) != 0  # NaN or an infinity (inf - inf is NaN)
        top = tl.reduce(tl.where(bad, 0.0, a), 0, tl.standard._elementwise_max)
        nonfinite = tl.reduce(bad.to(tl.int32), 0, tl.standard._sum_combine)
        tl.store(tops_ptr + block, tl.where(nonfinite > 0, float("inf"), top))


def _write_blocks(  # type: ignore[no-untyped-def]
    x_ptr, t_ptr, starts_ptr, counts_ptr, indices_ptr, values_ptr, n, capacity, SIGNED: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Block b's selected indices and values, in order, from output position ``starts[b]``, below ``capacity``. A
    block with nothing to write (none selected, ``counts[b] = 0``, or its start past the capacity) returns before
    reading ``x``: at ratio 1e-3 about a third of the blocks of 1024 elements. The ranks within a block are int32
    (at most ``BLOCK``): half the scan of int64."""
    block = tl.program_id(0)
    start = tl.load(starts_ptr + block)
    if (tl.load(counts_ptr + block) == 0) | (start >= capacity):
        return
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    v = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    hit = ((tl.abs(v) if SIGNED else v) >= tl.load(t_ptr)) & inside
    rank = tl.associative_scan(hit.to(tl.int32), 0, tl.standard._sum_combine)
    position = start + rank.to(tl.int64) - 1
    keep = hit & (position < capacity)
    tl.store(indices_ptr + position, offsets, mask=keep)
    tl.store(values_ptr + position, v, mask=keep)


def build(interpret: bool) -> tuple[Any, Any]:
    """The two kernels, interpreted (for CPU tensors) or for compilation on CUDA. Raises ImportError where Triton is
    not installed."""
    return triton_runtime.build(_count_blocks, interpret), triton_runtime.build(_write_blocks, interpret)


def select(
    x: torch.Tensor, t: torch.Tensor, signed: bool, capacity: int, extremes: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(indices, values, count, top)`` of the selection ``v >= t`` (``v = |x|`` when ``signed``, else ``x``) of the
    1-D float32 or float64 ``x``: the first ``capacity`` selected indices in increasing order (int64, then -1), ``x``
    there (then 0), the number selected (0-d int64) and with ``extremes`` the largest ``|x|`` (0-d of x's dtype, +inf
    where ``x`` holds a NaN or an infinity; else None), found by the same read as the counts; all on ``x``'s device,
    nothing read back to the host. ``t`` is a 0-d tensor of ``x``'s dtype and device, strictly positive (zeros are
    never selected) or NaN."""
    count_kernel, write_kernel = build(interpret=x.device.type == "cpu")
    x = x.contiguous()
    n = x.numel()
    indices = torch.full((capacity,), -1, dtype=torch.int64, device=x.device)
    values = torch.zeros(capacity, dtype=x.dtype, device=x.device)
    if n == 0:
        top = torch.zeros((), dtype=x.dtype, device=x.device) if extremes else None
        return indices, values, torch.zeros((), dtype=torch.int64, device=x.device), top
    block = triton_runtime.block_for(x, BLOCK)
    grid = (-(-n // block),)
    counts = torch.empty(grid[0], dtype=torch.int64, device=x.device)
    tops = torch.empty(grid[0], dtype=x.dtype, device=x.device) if extremes else counts
    context, options = triton_runtime.launch(x)
    with context:
        count_kernel[grid](x, t, counts, tops, n, SIGNED=signed, EXTREMES=extremes, BLOCK=block, **options)
        ends = torch.cumsum(counts, 0)
        if capacity:
            write_kernel[grid](
                x, t, ends - counts, counts, indices, values, n, capacity, SIGNED=signed, BLOCK=block, **options
            )
    return indices, values, ends[-1], tops.amax() if extremes else None


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
    counts = torch.zeros(max(blocks, 1), dtype=torch.int64, device=x.device)
    tops = torch.zeros(max(blocks, 1), dtype=x.dtype, device=x.device) if extremes else counts
    if n:
        count_kernel, _ = build(interpret=x.device.type == "cpu")
        context, options = triton_runtime.launch(x)
        with context:
            count_kernel[(blocks,)](x, t, counts, tops, n, SIGNED=signed, EXTREMES=extremes, BLOCK=block, **options)
    ends = torch.cumsum(counts, 0)
    read = torch.stack([ends[-1].to(torch.float64), tops.amax().to(torch.float64)]) if extremes else ends[-1:]
    return Counted(x, t, signed, block, counts, ends, read, extremes)


@dataclass(frozen=True)
class Counted:
    """A selection counted on the device (:func:`count_exact`): ``read`` holds its total (and, with ``extremes``,
    the largest magnitude) for one read back."""

    x: torch.Tensor
    t: torch.Tensor
    signed: bool
    block: int
    counts: torch.Tensor
    ends: torch.Tensor
    read: torch.Tensor
    extremes: bool

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, float | None]:
        """Read the total back (one copy, with the maximum), then write the selection: :func:`select_exact`'s
        result."""
        values_read = self.read.tolist()  # the one host read: the output's size
        total = int(values_read[0])
        x = self.x
        indices = torch.empty(total, dtype=torch.int64, device=x.device)
        values = torch.empty(total, dtype=x.dtype, device=x.device)
        if total:
            _, write_kernel = build(interpret=x.device.type == "cpu")
            context, options = triton_runtime.launch(x)
            grid = (-(-x.numel() // self.block),)
            starts = self.ends - self.counts
            with context:
                write_kernel[grid](
                    x, self.t, starts, self.counts, indices, values, x.numel(), total, SIGNED=self.signed,
                    BLOCK=self.block,
                    **options,
                )  # fmt: skip
        return indices, values, (float(values_read[1]) if self.extremes else None)
