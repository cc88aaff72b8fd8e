"""The stage statistics' Triton form: :func:`gradstat.theory.kernels.stage_stats.summary` in one read of ``x``.

Compiled by torch on CUDA, the summary's reductions of different kinds (the largest and smallest magnitudes, the
count and the float64 sums) do not share one loop: the H100 profile at 366b7ed has three kernels for it, one of
them writing ``|x|`` out in full (0.079 + 0.048 + 0.058 ms at 26M elements, about 3.5 read passes). Here:

1. ``_summary_blocks``: one program per block of :data:`BLOCK` elements reads them once and stores its partials
   ``[min v, max v, #(v != 0), sum v, sum v^2, min of the nonzero v, sum log v, #NaN]`` (float64; ``v = |x|`` or
   ``x``; the sums of the float32 or float64 elements as read, accumulated in float64; each logarithm taken in x's
   dtype, as the reference takes it);
2. ``_summary_finish``: one program joins the blocks' partials in block order into the summary, NaN set where the
   reference propagates it (a NaN element makes the largest, the sums and, with the extremes, both minima NaN).

The result equals :func:`~gradstat.theory.kernels.stage_stats.summary`'s reference within the rounding of float64
sums taken in another order, and of each float32 logarithm (the catalog's bound, held by the equivalence battery in
``tests/kernels``, on CPU tensors through Triton's interpreter). Two launches, nothing read back to the host.
"""

from __future__ import annotations

from typing import Any

import torch

from gradstat.theory.kernels import triton_runtime

tl: Any = None
"""``triton.language``, bound by :func:`gradstat.theory.kernels.triton_runtime.build`."""

BLOCK = 4096
"""Elements per program on CUDA: 6,348 programs and partials at 26M elements."""
CHUNK = 1024
"""Partials the finishing program joins per step."""
PARTS = 8
DTYPES = (torch.float32, torch.float64)


def _summary_blocks(  # type: ignore[no-untyped-def]
    x_ptr, part_ptr, n, ABSOLUTE: tl.constexpr, EXTREMES: tl.constexpr, SQUARES: tl.constexpr, LOGS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    v = tl.abs(x) if ABSOLUTE else x
    nonzero = (v != 0) & inside  # (a NaN is nonzero, as the reference counts it)
    w = v.to(tl.float64)
    out = part_ptr + block.to(tl.int64) * 8
    tl.store(out + 1, tl.reduce(tl.where(inside, v, float("-inf")), 0, tl.standard._elementwise_max).to(tl.float64))
    tl.store(out + 2, tl.reduce(nonzero.to(tl.int32), 0, tl.standard._sum_combine).to(tl.float64))
    tl.store(out + 3, tl.reduce(w, 0, tl.standard._sum_combine))
    if SQUARES:
        tl.store(out + 4, tl.reduce(w * w, 0, tl.standard._sum_combine))
    if EXTREMES:
        tl.store(out + 0, tl.reduce(tl.where(inside, v, float("inf")), 0, tl.standard._elementwise_min).to(tl.float64))
        smallest = tl.reduce(tl.where(nonzero, v, float("inf")), 0, tl.standard._elementwise_min)
        tl.store(out + 5, smallest.to(tl.float64))
    if LOGS:
        logs = tl.log(tl.where(nonzero, v, 1.0)).to(tl.float64)
        tl.store(out + 6, tl.reduce(logs, 0, tl.standard._sum_combine))
    nan = (v != v) & inside
    tl.store(out + 7, tl.reduce(nan.to(tl.int32), 0, tl.standard._sum_combine).to(tl.float64))


def _summary_finish(  # type: ignore[no-untyped-def]
    part_ptr, out_ptr, blocks, EXTREMES: tl.constexpr, SQUARES: tl.constexpr, LOGS: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    lo = tl.full((CHUNK,), float("inf"), tl.float64)
    hi = tl.full((CHUNK,), float("-inf"), tl.float64)
    smallest = tl.full((CHUNK,), float("inf"), tl.float64)
    count = tl.full((CHUNK,), 0.0, tl.float64)
    total = tl.full((CHUNK,), 0.0, tl.float64)
    squares = tl.full((CHUNK,), 0.0, tl.float64)
    logs = tl.full((CHUNK,), 0.0, tl.float64)
    nans = tl.full((CHUNK,), 0.0, tl.float64)
    for start in range(0, blocks, CHUNK):
        rows = start + tl.arange(0, CHUNK)
        used = rows < blocks
        at = part_ptr + rows.to(tl.int64) * 8
        hi = tl.maximum(hi, tl.load(at + 1, mask=used, other=float("-inf")))
        count += tl.load(at + 2, mask=used, other=0.0)
        total += tl.load(at + 3, mask=used, other=0.0)
        nans += tl.load(at + 7, mask=used, other=0.0)
        if SQUARES:
            squares += tl.load(at + 4, mask=used, other=0.0)
        if EXTREMES:
            lo = tl.minimum(lo, tl.load(at + 0, mask=used, other=float("inf")))
            smallest = tl.minimum(smallest, tl.load(at + 5, mask=used, other=float("inf")))
        if LOGS:
            logs += tl.load(at + 6, mask=used, other=0.0)
    nan = tl.reduce(nans, 0, tl.standard._sum_combine) > 0
    not_a_number = float("nan")
    top = tl.where(nan, not_a_number, tl.reduce(hi, 0, tl.standard._elementwise_max))
    tl.store(out_ptr + 1, top)
    tl.store(out_ptr + 2, tl.reduce(count, 0, tl.standard._sum_combine))
    tl.store(out_ptr + 3, tl.where(nan, not_a_number, tl.reduce(total, 0, tl.standard._sum_combine)))
    if SQUARES:
        tl.store(out_ptr + 4, tl.where(nan, not_a_number, tl.reduce(squares, 0, tl.standard._sum_combine)))
    else:
        tl.store(out_ptr + 4, not_a_number)
    if EXTREMES:
        tl.store(out_ptr + 0, tl.where(nan, not_a_number, tl.reduce(lo, 0, tl.standard._elementwise_min)))
        tl.store(out_ptr + 5, tl.where(nan, not_a_number, tl.reduce(smallest, 0, tl.standard._elementwise_min)))
    else:
        tl.store(out_ptr + 0, 0.0)
        tl.store(out_ptr + 5, float("inf"))
    if LOGS:
        tl.store(out_ptr + 6, tl.where(nan, not_a_number, tl.reduce(logs, 0, tl.standard._sum_combine)))


_BROKEN = triton_runtime.Fallback("the Triton stage statistics", "GRADSTAT_COMPILE")
"""Set once the Triton summary has failed in this process (reported once; the other forms run from then on)."""


def exists(x: torch.Tensor, *_: object) -> bool:
    """Whether :func:`summary` can run on ``x``: a nonempty float32 or float64 tensor on CUDA (compiled) or a CPU
    (interpreted), Triton installed."""
    return x.device.type in ("cuda", "cpu") and x.dtype in DTYPES and x.numel() > 0 and triton_runtime.available()


def runs_on(x: torch.Tensor, *_: object) -> bool:
    """Whether the summary of ``x`` runs here by Triton (:func:`summary`): a CUDA tensor where :func:`exists` and
    the form has not failed in this process. A CPU tensor never (its C loop reads it once)."""
    return x.device.type == "cuda" and not _BROKEN.is_set() and exists(x)


def summary(
    x: torch.Tensor, absolute: bool, extremes: bool = True, squares: bool = True, logs: bool = False
) -> torch.Tensor:
    """:func:`gradstat.theory.kernels.stage_stats.summary` of ``x`` by the two kernels (the module docstring); the
    arguments are checked by the caller. Raises what Triton raises where it cannot build or launch them."""
    blocks_kernel = triton_runtime.build(_summary_blocks, interpret=x.device.type == "cpu")
    finish_kernel = triton_runtime.build(_summary_finish, interpret=x.device.type == "cpu")
    flat = x.detach().reshape(-1).contiguous()
    n = flat.numel()
    block = triton_runtime.block_for(flat, BLOCK)
    blocks = max(1, -(-n // block))
    parts = torch.empty((blocks, PARTS), dtype=torch.float64, device=flat.device)
    out = torch.empty(7 if logs else 6, dtype=torch.float64, device=flat.device)
    context, options = triton_runtime.launch(flat)
    with context:
        blocks_kernel[(blocks,)](
            flat, parts, n, ABSOLUTE=absolute, EXTREMES=extremes, SQUARES=squares, LOGS=logs, BLOCK=block, **options
        )
        chunk = CHUNK if flat.device.type == "cuda" else triton_runtime.INTERPRETED_BLOCK
        finish_kernel[(1,)](parts, out, blocks, EXTREMES=extremes, SQUARES=squares, LOGS=logs, CHUNK=chunk, **options)
    return out


def report(exc: Exception) -> None:
    """Record the Triton summary's failure (one RuntimeWarning per process); the other forms run from then on."""
    _BROKEN.report(exc)
