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

_FUNCTIONS = {torch.float32: "select_f32", torch.float64: "select_f64"}


def available(x: torch.Tensor) -> bool:
    """Whether :func:`select` runs on ``x``: a contiguous float32 or float64 CPU tensor, a compile policy other
    than ``never``, and the C extension installed."""
    if x.device.type != "cpu" or x.dtype not in _FUNCTIONS or not x.is_contiguous():
        return False
    return native.extension() is not None


_BUFFERS = threading.local()
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}
_MAX = {torch.float32: float(np.finfo(np.float32).max), torch.float64: math.inf}


def _buffer(slot: tuple[object, str], size: int, dtype: type, keep: int) -> np.ndarray:
    """This thread's output buffer for ``slot`` with room for ``size`` elements, its first ``keep`` kept when it
    grows (warm memory: fresh buffers of a few MB cost more in page faults than the whole selection)."""
    cache = getattr(_BUFFERS, "arrays", None)
    if cache is None:
        cache = _BUFFERS.arrays = {}
    key = (slot, dtype)
    buf = cache.get(key)
    if buf is None or buf.size < size:
        grown: np.ndarray = np.empty(max(size, 4096), dtype=dtype)
        if buf is not None and keep:
            grown[:keep] = buf[:keep]
        buf = cache[key] = grown
    return buf


def _scan(
    fn: Callable[..., tuple[int, int, float, bool]],
    data: np.ndarray,
    piece: tuple[str, int | None, int],
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
    count, top, nan = 0, -math.inf, False
    at = begin
    while True:
        idx = _buffer((piece, "indices"), want, np.int64, count)
        vals = _buffer((piece, "values"), want, data.dtype.type, count) if gather else None
        at, count, top, nan = fn(data, at, end, bound, absolute, idx, vals, count, top, nan)
        if at >= end:
            break
        want = min(end - begin, 2 * want)  # more selected than room: grow, keep what was found, resume
    return idx[:count], None if vals is None else vals[:count], top, nan


def _output(found: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    """Two or more pieces' ``found`` arrays (one piece's is :func:`_copied`) joined in a tensor of their own, from
    torch's allocator (which can back it with huge pages: with 4 KB pages the copy's page faults cost more than the
    selection's read at a density of 1 %)."""
    out = torch.empty(sum(f.size for f in found), dtype=dtype)
    np.concatenate(found, out=out.numpy())
    return out


def _copied(found: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """One piece's ``found`` array in a tensor of its own (:func:`_output` of one piece)."""
    out = torch.empty(found.size, dtype=dtype)
    out.numpy()[:] = found
    return out


def _in_dtype(t: float, dtype: torch.dtype) -> float:
    """The threshold rounded to the elements' dtype (the comparisons are then exact); beyond the dtype's range it
    compares as infinity, as in torch."""
    if abs(t) <= _MAX[dtype] or math.isnan(t):
        return float(_NUMPY[dtype](t))
    with np.errstate(over="ignore"):
        return float(_NUMPY[dtype](t))


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
    bound = _in_dtype(t, flat.dtype)
    parts = native.pieces(n)
    want = max(4096, (2 * expected if expected is not None else n // 64) // len(parts))
    if len(parts) == 1:  # one piece, in this thread's own buffers (no joins)
        idx, vals, top, nan = _scan(fn, data, ("own", None, 0), 0, n, bound, absolute, gather, min(n, want))
        indices = _copied(idx, torch.int64)
        return indices, None if vals is None else _copied(vals, flat.dtype), math.nan if nan else top
    caller = threading.get_ident()
    scans = [
        functools.partial(_scan, fn, data, ("piece", caller, i), a, b, bound, absolute, gather, min(b - a, want))
        for i, (a, b) in enumerate(parts)
    ]
    found = native.run_all(scans)
    indices = _output([f[0] for f in found], torch.int64)
    values = _output([f[1] for f in found if f[1] is not None], flat.dtype) if gather else None
    top = max(f[2] for f in found)
    return indices, values, math.nan if any(f[3] for f in found) else top
