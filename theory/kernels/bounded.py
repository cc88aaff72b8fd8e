"""The bounded selection: a threshold selection into buffers of fixed capacity, with its count left on the device.

:func:`gradstat.theory.kernels.primitives.select_at_least` returns exactly the selected indices, so its output size
is a host value: on CUDA it waits for the device. A sparsifier's encode must not (the device rules of the design:
compaction into a buffer of declared capacity). :func:`select_bounded` selects by the same rule (the nonzero
elements with ``x >= t``, or ``|x| >= t`` when ``signed``, ``t`` the threshold raised to the smallest positive
value of ``x``'s dtype by :func:`~gradstat.theory.kernels.primitives.positive_threshold`; NaN never selected) but
writes only the first ``capacity`` selected indices, increasing, and ``x`` there into buffers of that size
(:class:`Bounded`), with the number selected as a 0-d tensor on ``x``'s device, and a float64 *tally* of what a
queued encode reads back (the largest magnitude, the count, the tie-break's count). The caller reads the tally once,
when it sends the payload, and falls back to the exact selection where the count exceeds the capacity.

Forms, each equal to :func:`reference` bit for bit (the battery in ``tests/kernels`` holds them to it):

- :func:`reference`: ``select_at_least_reference`` and a copy into the buffers (it reads the count: the definition);
- :func:`eager`: plain torch with no host read, on any device: the comparison mask, ``torch.nonzero_static`` into
  the buffer (or, on a device whose torch has no such kernel, e.g. CUDA under torch 2.1, a cumulative sum of the
  mask and a scatter of the indices to their positions), ``count_nonzero`` for the count, a gather, and the tally's
  reductions, a launch each;
- :func:`triton`: three Triton kernels over blocks and a cumulative sum (:mod:`gradstat.theory.kernels.triton_select`:
  the counts, the writes, the tally with the buffers' padding), compiled on CUDA and interpreted on a CPU (how CI
  checks them without a GPU; never chosen for a CPU in use).

Which form runs (:func:`form_for`, the one place that decides): ``triton`` for a CUDA tensor where Triton is
installed, the compile policy (:func:`gradstat.theory.kernels.policy.policy`, ``GRADSTAT_COMPILE``) is not
``never`` and its kernels have not failed in this process; else ``eager``. A Triton build or launch that fails is
reported once per process as a RuntimeWarning, and the eager form runs from then on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gradstat.theory.kernels import counter_dither, policy, primitives, triton_runtime, triton_select
from gradstat.theory.kernels.peaks import Peaks

DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class Bounded:
    """A selection kept in buffers of fixed capacity; every tensor on the input's device.

    ``indices``: int64 ``[capacity]``, the first ``min(count, capacity)`` selected indices in increasing order, then
    -1. ``values``: the input's dtype ``[capacity]``, the input at those indices (its own signed values), then 0.
    ``count``: 0-d int64, how many elements the rule selects (more than ``capacity`` when the buffers overflowed).
    ``tally``: float64 ``[largest |x|, count, ties]``, what a queued encode reads back in one copy: the largest
    ``|x|`` where asked for (``extremes``: from the same read as the count; +inf where ``x`` holds a NaN or an
    infinity, 0 for an empty ``x``; else NaN), the count again, and, where asked for (``ties``; else 0), how many
    of the written magnitudes ``|values|`` equal the smallest written one (0 where none is written): the count a
    tie-break needs (:func:`~gradstat.compressors.schemes.sparsifiers.threshold.break_ties`)."""

    indices: torch.Tensor
    values: torch.Tensor
    count: torch.Tensor
    tally: torch.Tensor


def _check(
    x: torch.Tensor, threshold: torch.Tensor, capacity: int, extremes: bool = False, peaks: Peaks | None = None
) -> None:
    """Check the arguments: a clear ValueError for each mistake (``peaks`` too, whichever form runs)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype not in DTYPES:
        shape = f"a {x.dim()}-D {x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"select_bounded: x must be a 1-D float32 or float64 tensor (reshape(-1) it), got {shape}")
    if not isinstance(threshold, torch.Tensor) or threshold.dim() != 0 or not threshold.is_floating_point():
        got = f"a {threshold.dim()}-D {threshold.dtype} tensor" if isinstance(threshold, torch.Tensor) else threshold
        raise ValueError(f"select_bounded: threshold must be a 0-d floating tensor on x's device, got {got!r}")
    if threshold.device != x.device:
        raise ValueError(f"select_bounded: threshold is on {threshold.device}, x on {x.device}; put it on x's device")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"select_bounded: capacity must be a host int >= 0, got {capacity!r}")
    if peaks is not None:
        if extremes:
            raise ValueError("select_bounded: peaks skip elements, and the largest magnitude (extremes) needs them all")
        peaks.check(x, triton_runtime.block_for(x, triton_select.BLOCK))


def _threshold(x: torch.Tensor, threshold: torch.Tensor, capacity: int) -> torch.Tensor:
    """Check the arguments (:func:`_check`) and return the comparison threshold ``t``: a 0-d tensor of ``x``'s dtype
    on its device (:func:`~gradstat.theory.kernels.primitives.positive_threshold`; the Triton kernels make it
    themselves)."""
    _check(x, threshold, capacity)
    return primitives.positive_threshold(threshold, x)


def _tally(top: torch.Tensor | None, count: torch.Tensor, ties: torch.Tensor | None) -> torch.Tensor:
    """:attr:`Bounded.tally` from its parts (None: not asked for), in plain torch."""
    nan = torch.full((), torch.nan, dtype=torch.float64, device=count.device)
    zero = torch.zeros((), dtype=torch.float64, device=count.device)
    parts = (nan if top is None else top.double(), count.double(), zero if ties is None else ties.double())
    return torch.stack(parts)


def _ties(indices: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How many written magnitudes (``indices >= 0``) equal the smallest written one (0-d int64; 0 where none)."""
    valid = indices >= 0
    magnitudes = values.abs()
    smallest = torch.where(valid, magnitudes, math.inf).amin() if values.numel() else magnitudes.sum()
    return (valid & (magnitudes == smallest)).sum()


def reference(
    x: torch.Tensor,
    threshold: torch.Tensor,
    signed: bool,
    capacity: int,
    extremes: bool = False,
    ties: bool = False,
    peaks: Peaks | None = None,
) -> Bounded:
    """The definition: :func:`~gradstat.theory.kernels.primitives.select_at_least_reference`, its first
    ``capacity`` indices and ``x`` there copied into the buffers, and the tally (with ``extremes``, the largest
    ``|x|`` by ``x.abs().amax()``, +inf where that is not finite; with ``ties``, the written magnitudes equal to the
    smallest written one, counted). Reads the count on the host (any device). ``peaks`` (a hint that changes no
    result) is not read."""
    _check(x, threshold, capacity, extremes, peaks)
    t = _threshold(x, threshold, capacity)
    selected = primitives.select_at_least_reference(x, t, signed)
    kept = selected[:capacity]
    indices = torch.full((capacity,), -1, dtype=torch.int64, device=x.device)
    values = torch.zeros(capacity, dtype=x.dtype, device=x.device)
    indices[: kept.numel()] = kept
    values[: kept.numel()] = x[kept]
    top = None
    if extremes:
        top = x.abs().amax() if x.numel() else torch.zeros((), dtype=x.dtype, device=x.device)
        top = torch.where(torch.isfinite(top), top, torch.full((), torch.inf, dtype=x.dtype, device=x.device))
    tied = None
    if ties:
        magnitudes = x[kept].abs()
        tied = (magnitudes == magnitudes.min()).sum() if kept.numel() else torch.zeros((), dtype=torch.int64)
    count = torch.tensor(selected.numel(), dtype=torch.int64, device=x.device)
    return Bounded(indices, values, count, _tally(top, count, None if tied is None else tied.to(x.device)))


def eager(
    x: torch.Tensor,
    threshold: torch.Tensor,
    signed: bool,
    capacity: int,
    extremes: bool = False,
    ties: bool = False,
    peaks: Peaks | None = None,
) -> Bounded:
    """The bounded selection in plain torch, with no host read: runs on any device (and on ``meta`` tensors); it
    reads every element (``peaks`` not read)."""
    _check(x, threshold, capacity, extremes, peaks)
    return _eager(x, _threshold(x, threshold, capacity), signed, capacity, extremes, ties)


def _eager(
    x: torch.Tensor, t: torch.Tensor, signed: bool, capacity: int, extremes: bool = False, ties: bool = False
) -> Bounded:
    mask = (x.abs() if signed else x) >= t
    count = torch.count_nonzero(mask)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        indices = torch.full((capacity,), -1, dtype=torch.int64, device=x.device)
        values = torch.zeros(capacity, dtype=x.dtype, device=x.device)
        tied = torch.zeros((), dtype=torch.int64, device=x.device) if ties else None
        return Bounded(indices, values, count, _tally(zero if extremes else None, count, tied))
    indices = _first_true(mask, capacity)
    values = torch.where(indices >= 0, x.index_select(0, indices.clamp_min(0)), zero)
    tally = _tally(_top(x) if extremes else None, count, _ties(indices, values) if ties else None)
    return Bounded(indices, values, count, tally)


def _top(x: torch.Tensor) -> torch.Tensor:
    """The largest ``|x|`` of a nonempty ``x``, +inf where it holds a NaN or an infinity (the Triton form's)."""
    top = primitives.max_abs(x)
    return torch.where(torch.isfinite(top), top, torch.full((), torch.inf, dtype=x.dtype, device=x.device))


def first_true(mask: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, count)``: the first ``capacity`` indices of the True elements of the 1-D bool ``mask``, increasing,
    then -1 (int64), and how many are True (0-d int64), on the mask's device with no read back: the bounded
    selection of a rule that is not a threshold (a random draw's mask)."""
    return _first_true(mask, capacity), torch.count_nonzero(mask)


def _first_true(mask: torch.Tensor, capacity: int) -> torch.Tensor:
    """The first ``capacity`` indices of the True elements of the 1-D bool ``mask``, increasing, then -1 (int64):
    ``torch.nonzero_static``, or :func:`_first_true_scattered` on a device where this torch has no kernel for it."""
    try:
        return torch.nonzero_static(mask, size=capacity, fill_value=-1).squeeze(1)
    except NotImplementedError:
        return _first_true_scattered(mask, capacity)


def _first_true_scattered(mask: torch.Tensor, capacity: int) -> torch.Tensor:
    """:func:`_first_true` from operations every device has: the inclusive cumulative sum of the mask numbers the
    True elements 1, 2, ...; those numbered up to ``capacity`` scatter their index to that slot, every other
    element to one spare slot past the end (dropped)."""
    rank = torch.cumsum(mask, 0)
    slot = torch.where(mask & (rank <= capacity), rank - 1, capacity)
    out = torch.full((capacity + 1,), -1, dtype=torch.int64, device=mask.device)
    out.scatter_(0, slot, torch.arange(mask.numel(), device=mask.device))
    return out[:capacity]


def triton(
    x: torch.Tensor,
    threshold: torch.Tensor,
    signed: bool,
    capacity: int,
    extremes: bool = False,
    ties: bool = False,
    peaks: Peaks | None = None,
) -> Bounded:
    """The Triton form (:mod:`gradstat.theory.kernels.triton_select`): compiled for a CUDA ``x``, interpreted for a
    CPU one. Raises where Triton is not installed or its kernels fail (no fallback: :func:`select_bounded` has it)."""
    _check(x, threshold, capacity, extremes, peaks)
    return Bounded(*triton_select.select(x, threshold, signed, capacity, extremes, ties, peaks))


def triton_exists(x: torch.Tensor, *_: object) -> bool:
    """Whether :func:`triton` can run on ``x`` (its other arguments aside): Triton installed, ``x`` on CUDA (compiled)
    or a CPU (interpreted)."""
    return x.device.type in ("cuda", "cpu") and triton_select.available()


_BROKEN = triton_runtime.Fallback("the Triton bounded selection", policy.ENV)
"""Set once the Triton form has failed in this process (reported once; the eager form runs from then on)."""


def form_for(x: torch.Tensor) -> str:
    """The form :func:`select_bounded` runs on ``x`` (see the module docstring): ``triton`` or ``eager``."""
    if x.device.type != "cuda" or policy.policy() == "never" or _BROKEN.is_set() or not triton_select.available():
        return "eager"
    return "triton"


def select_bounded(
    x: torch.Tensor,
    threshold: torch.Tensor,
    signed: bool,
    capacity: int,
    extremes: bool = False,
    ties: bool = False,
    peaks: Peaks | None = None,
) -> Bounded:
    """The first ``capacity`` elements selected by ``x >= t`` (``|x| >= t`` when ``signed``; nonzero elements only,
    NaN never; ``t`` the 0-d ``threshold`` on ``x``'s device, in x's dtype, raised to the smallest positive value),
    their values, the count of all selected and the tally (:class:`Bounded`; with ``extremes`` the largest ``|x|``,
    from the same read where Triton runs; with ``ties`` the tie-break's count), with no read back to the host.
    ``x``: 1-D, float32 or float64; ``capacity``: a host int >= 0. ``peaks``: x's sub-block maxima
    (:mod:`gradstat.theory.kernels.peaks`, from an earlier read of x), whose sub-blocks below the threshold the
    Triton form does not read; the result is the same. Runs the form :func:`form_for` names."""
    _check(x, threshold, capacity, extremes, peaks)
    if form_for(x) == "triton":
        try:
            return Bounded(*triton_select.select(x, threshold, signed, capacity, extremes, ties, peaks))
        except Exception as exc:  # noqa: BLE001 - any build or launch failure falls back to the eager form
            _report_failure(exc)
    return _eager(x, primitives.positive_threshold(threshold, x), signed, capacity, extremes, ties)


def _report_failure(exc: Exception) -> None:
    """Turn the Triton form off for this process, with one RuntimeWarning (the first failure's)."""
    _BROKEN.report(exc)


def random_subset(d: int, k: int, key: torch.Tensor, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~gradstat.theory.kernels.counter_dither.subset` without a full sort or a read back:
    ``(indices, holds)``, the indices equal to its wherever the 0-d bool ``holds`` is true (a caller that finds it
    false, probability about 1e-9, takes the full subset). For a GPU, where the full ``torch.topk`` over d int64
    keys and the hash's twenty eager passes took 4.2 ms at 26M elements (an H100, reports/gpu/2026-11-26T1850Z.md).

    The elements a CPU subset keeps (hash below a cut expected to pass ``k`` plus
    :data:`~gradstat.theory.kernels.counter_dither.SUBSET_MARGIN_SIGMAS` standard deviations) are found by a threshold
    on :func:`~gradstat.theory.kernels.counter_dither.hash_keys_into` (one pass; the Triton kernel on CUDA) into a
    buffer of fixed size (:func:`select_bounded`): every key kept is at least the cut's (and nonzero), every key
    left out is below it (or zero: the 64 largest hashes), so each element kept has a smaller hash
    than each element left out, and with at least ``k`` kept the ``k`` of smallest ``(hash, index)`` are among
    them; they are ranked exactly on their hashes, computed again. ``holds``: at least ``k`` kept, and no more than
    the buffer holds. The indices are always within ``range(d)``."""
    cd = counter_dither
    if not 0 <= k <= d:
        raise ValueError(f"a subset of {k} elements of {d} does not exist")
    cd.check_indices(0, d)
    device = torch.device(device)
    margin = k + cd.SUBSET_MARGIN_SIGMAS * k**0.5 + 16
    if margin >= d:
        return cd.subset(d, k, key, device), torch.ones((), dtype=torch.bool, device=device)
    cut = -(1 << 31) + math.ceil(margin / d * 2**32)  # P(h < cut) = margin / d, as subset's
    room = max(k, cd.subset_room(d, margin))  # (at least k: the ranking below takes k of the buffer)
    keys_ = torch.empty((1, d), dtype=torch.float32, device=device)
    cd.run_rows(cd.KERNELS["hash_keys_into"], keys_, (), torch.ones((1, 1), device=device), 0, key)
    at_cut = float(np.float32(2147483648.0) - np.float32(cut))  # (the key of the cut, rounded as the keys are)
    selected = select_bounded(keys_.view(-1), torch.full((), at_cut, device=device), False, room)
    valid = selected.indices >= 0
    hashes = torch.where(valid, cd.hash_at(selected.indices.clamp_min(0).to(torch.int32), key), (1 << 31) - 1)
    chosen = cd.k_smallest(hashes, torch.where(valid, selected.indices, (1 << 31) - 1), k).clamp_(0, d - 1)
    return chosen, (selected.count >= k) & (selected.count <= room)
