"""The stage statistics' Triton form: :func:`gradstat.theory.kernels.stage_stats.summary` in one read of ``x``.

Compiled by torch on CUDA, the summary's reductions of different kinds (the largest and smallest magnitudes, the
count and the float64 sums) do not share one loop: the H100 profile at 366b7ed has three kernels for it, one of
them writing ``|x|`` out in full (0.079 + 0.048 + 0.058 ms at 26M elements, about 3.5 read passes). Here:

1. ``_summary_blocks``: one program per block of :data:`BLOCK` elements reads them once and stores its partials
   ``[min v, max v, #(v != 0), sum v, sum v^2, min of the nonzero v, sum log v, #NaN]`` (float64; ``v = |x|`` or
   ``x``; the sums of the float32 or float64 elements as read, accumulated in float64; each logarithm taken in x's
   dtype, as the reference takes it);
2. ``_join_blocks``: one program joins the blocks' partials in block order into the summary, NaN set where the
   reference propagates it (a NaN element makes the largest, the sums and, with the extremes, both minima NaN).

:func:`~gradstat.theory.kernels.stage_stats.tail_moments` is the same pair: ``_tail_blocks`` stores each block's
count and float64 sums over ``|x| > above`` in the same layout, and ``_join_blocks`` joins them (``TAIL``).

Each result equals its reference within the rounding of float64 sums taken in another order, and of each float32
logarithm (the catalog's bounds, held by the equivalence battery in ``tests/kernels``, on CPU tensors through
Triton's interpreter). Two launches, nothing read back to the host. Compiled functions call them as operators
(:data:`SUMMARY_OP`, :data:`TAIL_OP`, on the devices of :data:`GRAPH_DEVICES`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gradstat.theory.kernels import peaks, triton_runtime
from gradstat.theory.kernels.peaks import Peaks

tl: Any = None
"""``triton.language``, bound by :func:`gradstat.theory.kernels.triton_runtime.build`."""

BLOCK = 4096
"""Elements per program on CUDA: 6,348 programs and partials at 26M elements."""
CHUNK = 1024
"""Partials the finishing program joins per step."""
PARTS = 8
DTYPES = (torch.float32, torch.float64)


def _summary_blocks(  # type: ignore[no-untyped-def]
    x_ptr, part_ptr, peaks_ptr, n, n_peaks, ABSOLUTE: tl.constexpr, EXTREMES: tl.constexpr, SQUARES: tl.constexpr,
    LOGS: tl.constexpr, PEAKS: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Block b's partials (the module docstring); with PEAKS also the largest ``|x|`` of each of its sub-blocks of
    SUB elements into ``peaks`` (+inf where one holds a NaN or an infinity: :mod:`gradstat.theory.kernels.peaks`)."""
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    if PEAKS:
        a = tl.abs(x)
        marked = tl.where((a - a) != 0, float("inf"), a)  # (NaN or an infinity: inf - inf is NaN)
        peak = tl.reduce(tl.reshape(marked, (BLOCK // SUB, SUB)), 1, tl.standard._elementwise_max)
        subs = block.to(tl.int64) * (BLOCK // SUB) + tl.arange(0, BLOCK // SUB)
        tl.store(peaks_ptr + subs, peak, mask=subs < n_peaks)
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


def _join_blocks(  # type: ignore[no-untyped-def]
    part_ptr, out_ptr, blocks, TAIL: tl.constexpr, EXTREMES: tl.constexpr, SQUARES: tl.constexpr,
    LOGS: tl.constexpr, CHUNK: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """The blocks' partials (8 per block, the summary's layout) joined in block order: the summary, NaN set where the
    reference propagates it; with TAIL, the tail statistics ``[n, sum z, sum z^2, sum log z]`` (columns 2, 3, 4 and
    6; NaN plays no part: the comparison leaves it out)."""
    lo = tl.full((CHUNK,), float("inf"), tl.float64)
    hi = tl.full((CHUNK,), float("-inf"), tl.float64)
    smallest = tl.full((CHUNK,), float("inf"), tl.float64)
    count = tl.full((CHUNK,), 0.0, tl.float64)
    total = tl.full((CHUNK,), 0.0, tl.float64)
    squares = tl.full((CHUNK,), 0.0, tl.float64)
    logs = tl.full((CHUNK,), 0.0, tl.float64)
    nans = tl.full((CHUNK,), 0.0, tl.float64)
    for step in range(STEPS):  # (a constant count: Triton 3.6's interpreter cannot loop to a runtime bound)
        rows = step * CHUNK + tl.arange(0, CHUNK)
        used = rows < blocks
        at = part_ptr + rows.to(tl.int64) * 8
        count += tl.load(at + 2, mask=used, other=0.0)
        total += tl.load(at + 3, mask=used, other=0.0)
        if not TAIL:
            hi = tl.maximum(hi, tl.load(at + 1, mask=used, other=float("-inf")))
            nans += tl.load(at + 7, mask=used, other=0.0)
        if SQUARES:
            squares += tl.load(at + 4, mask=used, other=0.0)
        if EXTREMES:
            lo = tl.minimum(lo, tl.load(at + 0, mask=used, other=float("inf")))
            smallest = tl.minimum(smallest, tl.load(at + 5, mask=used, other=float("inf")))
        if LOGS:
            logs += tl.load(at + 6, mask=used, other=0.0)
    not_a_number = float("nan")
    if TAIL:
        tl.store(out_ptr + 0, tl.reduce(count, 0, tl.standard._sum_combine))
        tl.store(out_ptr + 1, tl.reduce(total, 0, tl.standard._sum_combine))
        tl.store(out_ptr + 2, tl.reduce(squares, 0, tl.standard._sum_combine) if SQUARES else not_a_number)
        if LOGS:
            tl.store(out_ptr + 3, tl.reduce(logs, 0, tl.standard._sum_combine))
        return
    nan = tl.reduce(nans, 0, tl.standard._sum_combine) > 0
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


def _tail_blocks(  # type: ignore[no-untyped-def]
    x_ptr, above_ptr, shift_ptr, inv_unit_ptr, part_ptr, n, LOGS: tl.constexpr, SQUARES: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0)
    a = tl.abs(x)
    wide = a.to(tl.float64)
    used = (wide > tl.load(above_ptr)) & inside
    z = tl.where(used, (wide - tl.load(shift_ptr)) * tl.load(inv_unit_ptr), 0.0)
    out = part_ptr + block.to(tl.int64) * 8  # (the summary's layout: n, sums of z, z^2 and log z at 2, 3, 4, 6)
    tl.store(out + 2, tl.reduce(used.to(tl.int32), 0, tl.standard._sum_combine).to(tl.float64))
    tl.store(out + 3, tl.reduce(z, 0, tl.standard._sum_combine))
    if SQUARES:
        tl.store(out + 4, tl.reduce(z * z, 0, tl.standard._sum_combine))
    if LOGS:  # each logarithm of |x| in x's dtype, plus log(inv_unit) in float64, as the reference
        log_a = tl.log(tl.where(used, a, 1.0)).to(tl.float64)
        log_z = tl.where(used, log_a + tl.log(tl.load(inv_unit_ptr)), 0.0)
        tl.store(out + 6, tl.reduce(log_z, 0, tl.standard._sum_combine))


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
    return _summary(x, absolute, extremes, squares, logs, None)


def summary_and_peaks(
    x: torch.Tensor, absolute: bool, extremes: bool = True, squares: bool = True, logs: bool = False
) -> tuple[torch.Tensor, Peaks]:
    """:func:`summary` of ``x`` and, from the same read, its sub-block maxima
    (:class:`~gradstat.theory.kernels.peaks.Peaks`, sub-blocks of :func:`~gradstat.theory.kernels.peaks.sub_for`
    elements): one more store per sub-block (a thirty-second of the vector's bytes, on CUDA)."""
    flat = x.detach().reshape(-1)
    sub = peaks.sub_for(flat)
    found = torch.empty(-(-flat.numel() // sub), dtype=flat.dtype, device=flat.device)
    return _summary(x, absolute, extremes, squares, logs, found), peaks.Peaks(found, sub)


def _summary(
    x: torch.Tensor, absolute: bool, extremes: bool, squares: bool, logs: bool, found: torch.Tensor | None
) -> torch.Tensor:
    blocks_kernel = triton_runtime.build(_summary_blocks, interpret=x.device.type == "cpu")
    finish_kernel = triton_runtime.build(_join_blocks, interpret=x.device.type == "cpu")
    flat = x.detach().reshape(-1).contiguous()
    n = flat.numel()
    block = triton_runtime.block_for(flat, BLOCK)
    blocks = max(1, -(-n // block))
    parts = torch.empty((blocks, PARTS), dtype=torch.float64, device=flat.device)
    out = torch.empty(7 if logs else 6, dtype=torch.float64, device=flat.device)
    sub = peaks.sub_for(flat)
    context, options = triton_runtime.launch(flat)
    with context:
        blocks_kernel[(blocks,)](
            flat, parts, parts if found is None else found, n, 0 if found is None else found.numel(),
            ABSOLUTE=absolute, EXTREMES=extremes, SQUARES=squares, LOGS=logs, PEAKS=found is not None, SUB=sub,
            BLOCK=block, **options,
        )  # fmt: skip
        chunk, steps = triton_runtime.finishing_steps(blocks, flat, CHUNK)
        finish_kernel[(1,)](
            parts, out, blocks, TAIL=False, EXTREMES=extremes, SQUARES=squares, LOGS=logs, CHUNK=chunk, STEPS=steps,
            **options,
        )  # fmt: skip
    return out


def tail_moments(
    x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool, squares: bool = True
) -> torch.Tensor:
    """:func:`gradstat.theory.kernels.stage_stats.tail_moments` of ``x`` by two kernels as :func:`summary`'s: the
    blocks' ``[n, sum z, sum z^2, sum log z]`` (float64, ``z = (|x| - shift) inv_unit`` over ``|x| > above``, the
    comparison and ``z`` in float64, each logarithm of ``|x|`` in x's dtype plus ``log inv_unit`` in float64, as the
    reference takes them), joined in block order. ``above``, ``shift``, ``inv_unit``: 0-d float64 tensors on x's
    device."""
    interpret = x.device.type == "cpu"
    blocks_kernel = triton_runtime.build(_tail_blocks, interpret)
    finish_kernel = triton_runtime.build(_join_blocks, interpret)
    flat = x.detach().reshape(-1).contiguous()
    n = flat.numel()
    block = triton_runtime.block_for(flat, BLOCK)
    blocks = max(1, -(-n // block))
    parts = torch.empty((blocks, PARTS), dtype=torch.float64, device=flat.device)
    out = torch.empty(4 if logs else 3, dtype=torch.float64, device=flat.device)
    scalars = [s.to(device=flat.device, dtype=torch.float64).reshape(()) for s in (above, shift, inv_unit)]
    context, options = triton_runtime.launch(flat)
    with context:
        blocks_kernel[(blocks,)](flat, *scalars, parts, n, LOGS=logs, SQUARES=squares, BLOCK=block, **options)
        chunk, steps = triton_runtime.finishing_steps(blocks, flat, CHUNK)
        finish_kernel[(1,)](
            parts, out, blocks, TAIL=True, EXTREMES=False, SQUARES=squares, LOGS=logs, CHUNK=chunk, STEPS=steps,
            **options,
        )  # fmt: skip
    return out


def report(exc: Exception) -> None:
    """Record the Triton summary's failure (one RuntimeWarning per process); the other forms run from then on."""
    _BROKEN.report(exc)


GRAPH_DEVICES = ("cuda",)
"""Device types on which a function that torch.compile builds calls these kernels as opaque operators
(:data:`SUMMARY_OP`, :data:`TAIL_OP`) instead of tracing the references into its own kernels: on CUDA, torch's
generated reductions of the SIDCo stages took 0.05-1.0 ms per pass at 26M elements on an H100 (a read pass takes
0.053 ms), some writing full-size temporaries. Tests add ``cpu`` to run the same path through Triton's interpreter."""


def in_graph(x: torch.Tensor) -> bool:
    """Whether a compiled function calls the operators on ``x`` (read while torch.compile traces: plain values): a
    nonempty float32 or float64 tensor on a device of :data:`GRAPH_DEVICES`, the form not failed."""
    return x.device.type in GRAPH_DEVICES and x.dtype in DTYPES and x.numel() > 0 and not _BROKEN.failed


def _reference(name: str) -> Callable[..., torch.Tensor]:
    """The eager reference of the stage statistic ``name`` (imported when first needed: stage_stats imports this
    module)."""
    from gradstat.theory.kernels import stage_stats

    kernel = getattr(stage_stats, name)
    return kernel.reference


def _summary_op(x: torch.Tensor, absolute: bool, extremes: bool, squares: bool, logs: bool) -> torch.Tensor:
    try:
        return summary(x, absolute, extremes, squares, logs)
    except Exception as exc:  # noqa: BLE001  (reported once, the reference answers; raised again in a CUDA capture)
        report(exc)
        return _reference("summary")(x, absolute, extremes, squares, logs)


def _summary_fake(x: torch.Tensor, absolute: bool, extremes: bool, squares: bool, logs: bool) -> torch.Tensor:
    return x.new_empty((7 if logs else 6,), dtype=torch.float64)


def _tail_op(
    x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool, squares: bool
) -> torch.Tensor:
    try:
        return tail_moments(x, above, shift, inv_unit, logs, squares)
    except Exception as exc:  # noqa: BLE001  (reported once, the reference answers; raised again in a CUDA capture)
        report(exc)
        return _reference("tail_moments")(x, above, shift, inv_unit, logs, squares)


def _tail_fake(
    x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool, squares: bool
) -> torch.Tensor:
    return x.new_empty((4 if logs else 3,), dtype=torch.float64)


def _register(name: str, fn: Callable[..., torch.Tensor], fake: Callable[..., torch.Tensor]) -> Any:
    """``fn`` as the operator ``gradstat::name`` with its shape function ``fake`` (torch 2.4's custom_op), or None
    where this torch has no such API, Triton is not installed, or the name is taken."""
    custom_op = getattr(torch.library, "custom_op", None)
    if custom_op is None or not triton_runtime.available():
        return None
    try:
        op = custom_op(f"gradstat::{name}", mutates_args=())(fn)
        op.register_fake(fake)
    except Exception:  # noqa: BLE001  (the compiled functions then trace the references, as before)
        return None
    return op


SUMMARY_OP = _register("summary", _summary_op, _summary_fake)
TAIL_OP = _register("tail_moments", _tail_op, _tail_fake)


def tail_in_graph(
    x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool, squares: bool = True
) -> torch.Tensor:
    """:data:`TAIL_OP` with every argument given (an operator's schema has no defaults here)."""
    return TAIL_OP(x, above, shift, inv_unit, logs, squares)
