"""Threshold compaction on a CPU: the increasing indices of ``v_i >= t`` (``v = |x|`` or ``x``) in one read.

Every threshold sparsifier ends in this step, and no torch or numpy operation does it in one pass: a comparison
writes a full mask, and ``nonzero`` reads it again and counts before it writes (numpy's chunked form of
:func:`gradstat.theory.kernels.primitives.select_at_least` costs ~4 read passes at 26M, of which the absolute
value, the comparison and the search each take about one). Compaction cannot be written as a ``torch.compile`` kernel
either (its output length depends on the data). So this module runs one small C loop of gradstat's own
(``select_f32``/``select_f64`` in ``_native.c``, built at install, see :mod:`gradstat.theory.kernels.native`):

- 16 elements per step: two AVX2 comparisons give a 16-bit mask, and only its set bits are visited (at the
  densities sparsifiers use, most steps find none), with the largest magnitude and a NaN flag kept on the way, so
  that the same read is also the vector's finiteness check;
- a portable scalar loop where AVX2 is missing (checked at run time) and for float64 vectors.

The output grows by doubling: a call stops before a step could overflow its buffers and is resumed with larger
ones. Where the extension is absent (installed without a C compiler) or turned off (``GRADSTAT_COMPILE=never``),
:func:`available` is false and callers keep their numpy path; the tests hold both to the same plain reference.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable

import numpy as np
import torch

from gradstat.theory.kernels import native
from gradstat.theory.kernels.scratch import scratch

_FUNCTIONS = {torch.float32: "select_f32", torch.float64: "select_f64"}


def available(x: torch.Tensor) -> bool:
    """Whether :func:`select` runs on ``x``: a contiguous float32 or float64 CPU tensor, a compile policy other
    than ``never``, and the C extension installed."""
    if x.device.type != "cpu" or x.dtype not in _FUNCTIONS or not x.is_contiguous():
        return False
    return native.extension() is not None


def _scan(
    fn: Callable[..., tuple[int, int, float, bool]],
    data: np.ndarray,
    piece: str,
    begin: int,
    end: int,
    bound: float,
    absolute: bool,
    gather: bool,
    want: int,
) -> tuple[np.ndarray, np.ndarray | None, float, bool]:
    """The piece ``[begin, end)`` of a selection, in this thread's buffers for the slot ``piece`` (the calling
    thread and the piece's number: a pool thread may run two pieces of one call, or pieces of two callers' calls
    before either has joined its results): the selected indices (absolute), their values with ``gather``, the
    piece's largest value and whether it holds a NaN."""

    cpu, values = torch.device("cpu"), torch.from_numpy(data[:0]).dtype
    count, top, nan = 0, -math.inf, False
    at = begin
    while True:
        # this thread's warm buffers (fresh ones of a few MB cost more in page faults than the whole selection)
        idx = scratch(want, torch.int64, cpu, f"compaction indices {piece}", keep=count).numpy()
        vals = scratch(want, values, cpu, f"compaction values {piece}", keep=count).numpy() if gather else None
        at, count, top, nan = fn(data, at, end, bound, absolute, idx, vals, count, top, nan)
        if at >= end:
            break
        want = min(end - begin, 2 * want)  # more selected than room: grow, keep what was found, resume
    return idx[:count], None if vals is None else vals[:count], top, nan


def _output(found: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    """The pieces' ``found`` arrays joined in a tensor of their own, from torch's allocator (which can back it with
    huge pages: with 4 KB pages the copy's page faults cost more than the selection's read at a density of 1 %)."""
    out = torch.empty(sum(f.size for f in found), dtype=dtype)
    np.concatenate(found, out=out.numpy())
    return out


def select(
    x: torch.Tensor, t: float, absolute: bool, gather: bool = False, expected: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """``(indices, values, top)`` of the flat ``x`` (see :func:`available`): the increasing int64 indices of the
    elements with ``v >= t`` (``v = |x|`` when ``absolute``, else ``x``; NaN never selected), their ``v`` with
    ``gather`` (else None), and the largest ``v`` of the whole vector (NaN if any element is NaN; -inf if empty).
    ``t`` is compared in ``x``'s dtype. ``expected``: the count the caller expects (sizes the first buffers). A
    long vector is read in pieces on torch's threads (:func:`gradstat.theory.kernels.native.pieces`), each into its
    thread's buffers, joined in order."""
    flat = x.reshape(-1)
    n = flat.numel()
    ext = native.extension()
    assert ext is not None, "select() needs available(x)"
    fn = getattr(ext, _FUNCTIONS[flat.dtype])
    data = flat.detach().numpy()
    with np.errstate(over="ignore"):  # (a threshold beyond the dtype's range compares as infinity, as in torch)
        bound = float(data.dtype.type(t))  # the threshold in x's dtype: the comparisons are exact
    parts = native.pieces(n)
    caller = threading.get_ident()
    want = max(4096, (2 * expected if expected is not None else n // 64) // len(parts))
    found = native.run_all(
        [
            functools.partial(_scan, fn, data, f"{caller} {i}", a, b, bound, absolute, gather, min(b - a, want))
            for i, (a, b) in enumerate(parts)
        ]
    )
    indices = _output([f[0] for f in found], torch.int64)
    values = _output([f[1] for f in found if f[1] is not None], flat.dtype) if gather else None
    top = max((f[2] for f in found), default=-math.inf)
    return indices, values, math.nan if any(f[3] for f in found) else top
