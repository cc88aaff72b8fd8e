"""Fused one-pass statistics of magnitudes: what every fit and peak-over-threshold stage reads from |g|.

:func:`summary` gives min, max, the number of non-zeros and the sums of v and v^2 (the validation of
:func:`gradstat.theory.estimators.magnitudes.check_magnitudes`, and the first stage's statistics in the same read);
:func:`tail_moments` gives, over the used elements ``|x| > above``, their count and the sums of z, z^2 and
(optionally) log z with ``z = (|x| - shift) / unit``: the sufficient statistics of the closed-form and moment
estimators (exponential: mean; generalized Pareto: mean and variance, SIDCo (Abdelmoniem et al.), Lemma 2 (7)-(9)
and Cor. 2.1 (10)-(11); gamma: mean and mean log, Cor. 1.2 (16)). Every sum is accumulated in float64 from the
elements as read (float32 or float64), so no square, sum or logarithm over- or underflows at any scale of a finite
float32 vector, and the elements are never rewritten.

Each is one read of ``x`` by gradstat's C loop (``summary_f32``/``tail_f32`` of the extension: a contiguous float32
CPU vector) or by its compiled kernel (:mod:`gradstat.theory.kernels.fused`), as
:mod:`gradstat.theory.kernels.policy` chooses; :func:`summary` of a CUDA tensor by its two Triton kernels
(:mod:`gradstat.theory.kernels.triton_stats`: one read, where torch's compiled form took three and wrote ``|x|``)
unless the policy is ``never``; eagerly, the same functions are the plain reference (several passes
and float64 temporaries). The forms agree within the rounding of float64 sums taken in another order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TypeVar

import torch

from gradstat.theory.kernels import native, triton_stats
from gradstat.theory.kernels.fused import TritonForm, compiling, with_native
from gradstat.theory.kernels.peaks import Peaks

T = TypeVar("T")


SUM_BLOCK = 1 << 16
"""Elements per block of the C loops' sums: each block's partial sums are formed alike whatever the thread count,
and the blocks' partials are added exactly rounded (``math.fsum``), so a statistic does not depend on how many
threads read the vector (a recorded run and its replay on another thread count give the same thresholds)."""


def _by_blocks(loop: Callable[..., T], data: object, n: int, *args: object) -> list[T]:
    """``loop(data, start, stop, *args)`` of every :data:`SUM_BLOCK`-element block of ``n`` elements, in block
    order; the blocks shared out over torch's threads in contiguous runs
    (:func:`gradstat.theory.kernels.native.pieces`)."""

    def read(a: int, b: int) -> T:
        return loop(data, a, b, *args)

    blocks = [(a, min(a + SUM_BLOCK, n)) for a in range(0, n, SUM_BLOCK)] or [(0, 0)]
    pieces = native.pieces(n)
    if len(pieces) == 1:  # one thread reads them all, here
        return [read(a, b) for a, b in blocks]
    runs: list[list[tuple[int, int]]] = [[] for _ in pieces]
    starts = [a for a, _ in pieces]
    for block in blocks:
        runs[max(i for i, a in enumerate(starts) if a <= block[0])].append(block)

    def run(part: list[tuple[int, int]]) -> list[T]:
        return [read(a, b) for a, b in part]

    return [r for part in native.run_all([functools.partial(run, part) for part in runs if part]) for r in part]


def _native_summary(
    x: torch.Tensor, absolute: bool, extremes: bool = True, squares: bool = True, logs: bool = False
) -> torch.Tensor:
    """:func:`summary` by the C loop, block by block over torch's threads, the blocks joined (NaN set where torch
    propagates it)."""
    _check_summary(absolute, extremes, logs)
    ext = native.extension()
    assert ext is not None
    data = x.detach().reshape(-1).numpy()
    parts = _by_blocks(ext.summary_f32, data, data.size, absolute, extremes, squares, logs)
    nan = any(p[6] for p in parts)
    lo = min(p[0] for p in parts)
    hi = max(p[1] for p in parts)
    count = float(sum(p[2] for p in parts))
    total = math.fsum(p[3] for p in parts)
    sum_sq = math.fsum(p[4] for p in parts) if squares else math.nan
    smallest = min(p[5] for p in parts)
    sum_log = math.fsum(p[7] for p in parts)
    if nan:
        hi, total, sum_sq, sum_log = math.nan, math.nan, math.nan, math.nan
        if extremes:
            lo, smallest = math.nan, math.nan
    values = (lo, hi, count, total, sum_sq, smallest) + ((sum_log,) if logs else ())
    return torch.tensor(values, dtype=torch.float64)


def _checked_summary(
    absolute: bool, extremes: bool = True, squares: bool = True, logs: bool = False
) -> tuple[bool, bool, bool, bool]:
    """:func:`summary`'s flags, checked as every form checks them (:func:`_check_summary`), all four given."""
    _check_summary(absolute, extremes, logs)
    return absolute, extremes, squares, logs


def _check_summary(absolute: bool, extremes: bool, logs: bool) -> None:
    if not extremes and not absolute:
        raise ValueError("summary without extremes needs magnitudes (absolute=True): the minimum checks signs")
    if logs and not absolute:
        raise ValueError("summary with logarithms needs magnitudes (absolute=True)")


def _native_tail(
    x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool, squares: bool = True
) -> torch.Tensor:
    """:func:`tail_moments` (without logarithms) by the C loop, block by block over torch's threads, the blocks'
    sums joined."""
    values = tail_values(x, float(above), float(shift), float(inv_unit), squares, logs)
    return torch.tensor(values if logs else values[:3], dtype=torch.float64)


def tail_values(
    x: torch.Tensor, above: float, shift: float, inv_unit: float, squares: bool = True, logs: bool = False
) -> tuple[float, float, float, float]:
    """The C loop of :func:`tail_moments` on host numbers: ``(n, sum z, sum z^2, sum log z)`` as Python floats (the
    sum of logarithms NaN without ``logs``), for a caller whose scalar arithmetic runs on the host
    (:mod:`gradstat.theory.scalars`). Only where ``tail_moments.native_for`` holds. The C loop takes each
    logarithm in float64 of the float32 magnitude (the reference takes it in float32: within the 2 ulps of each
    logarithm the catalog allows)."""
    ext = native.extension()
    assert ext is not None
    data = x.detach().reshape(-1).numpy()
    parts = _by_blocks(ext.tail_f32, data, data.size, above, shift, inv_unit, squares, logs)
    count = float(sum(p[0] for p in parts))
    total = math.fsum(p[1] for p in parts)
    sum_sq = math.fsum(p[2] for p in parts) if squares else math.nan
    sum_log = math.fsum(p[3] for p in parts) if logs else math.nan
    return (count, total, sum_sq, sum_log)


def _summary_applies(x: torch.Tensor, *args: object) -> bool:
    return x.numel() > 0 and native.reads_float32(x)


def _tail_applies(x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool,
                  squares: bool = True) -> bool:  # fmt: skip
    return native.reads_float32(x)


def count_true(mask: torch.Tensor) -> torch.Tensor:
    """How many elements of the bool ``mask`` are True, as a 0-d float64 tensor (exact below 2^53). Eagerly
    ``torch.count_nonzero`` (a bool ``.sum()`` costs ~12x as much on a CPU: 131 against 11 ms at 26M, one thread);
    compiled, a float64 sum in the kernels' own reduction: Triton 3.6 (torch 2.11) failed to build the fused SIDCo
    stages where an int64 sum of block counts fed the scalar steps in one persistent reduction ("operand does not
    dominate this use"; both failing kernels of the H100 run build with the float64 sum, compiled for sm_90 here)."""
    return mask.sum(dtype=torch.float64) if compiling() else torch.count_nonzero(mask).double()


@with_native(
    _native_summary,
    _summary_applies,
    TritonForm(
        lambda x, *flags: triton_stats.summary(x, *_checked_summary(*flags)),
        triton_stats.runs_on,
        triton_stats.report,
        (lambda x, *flags: triton_stats.SUMMARY_OP(x, *_checked_summary(*flags))) if triton_stats.SUMMARY_OP else None,
        triton_stats.in_graph,
    ),
)
def summary(
    x: torch.Tensor, absolute: bool, extremes: bool = True, squares: bool = True, logs: bool = False
) -> torch.Tensor:
    """``[min v, max v, #(v != 0), sum v, sum v^2, min of the nonzero v]`` of ``v = |x|`` (``absolute``) or ``v = x``,
    as a float64 tensor of 6 (NaN propagates into min and max; the last is +inf when all are zero). The sums are
    exact at every scale of float32 values (their squares stay within float64's range); for float64 values they
    may overflow and are not used. Without ``extremes`` (magnitudes only: ``absolute``) the two minima are not
    read (a fifth less work compiled) and stand at their bounds, 0 and +inf; NaN and Inf still reach the max.
    Without ``squares`` the sum of squares is not computed (a tenth less work compiled, for a reader that needs
    only means: the exponential fit) and stands at NaN. With ``logs`` (magnitudes only) a seventh entry is the sum
    of log v over the nonzero v (the statistic of a gamma fit, SIDCo (16), read in the same pass), each logarithm
    taken in x's dtype as :func:`tail_moments` takes it; NaN propagates into it."""
    _check_summary(absolute, extremes, logs)
    v = x.abs() if absolute else x
    w = v.double()
    sum_sq = (w * w).sum() if squares else torch.full((), torch.nan, dtype=torch.float64, device=x.device)
    if not extremes:
        low = torch.zeros((), dtype=torch.float64, device=x.device)  # (fills: nothing copied from the host)
        high = torch.full((), torch.inf, dtype=torch.float64, device=x.device)
        parts = [low, v.amax().double(), count_true(v != 0), w.sum(), sum_sq, high]
    else:
        smallest_nonzero = torch.where(v != 0, v, torch.inf).amin().double()
        parts = [v.amin().double(), v.amax().double(), count_true(v != 0), w.sum(), sum_sq, smallest_nonzero]
    if logs:
        parts.append(torch.log(torch.where(v != 0, v, 1.0)).double().sum())
    return torch.stack(parts)


def summary_and_peaks(
    x: torch.Tensor, absolute: bool, extremes: bool = True, squares: bool = True, logs: bool = False
) -> tuple[torch.Tensor, Peaks | None]:
    """:func:`summary` of ``x`` and, where its Triton form is the one that runs (a CUDA tensor), the sub-block maxima
    of ``|x|`` from the same read (:mod:`gradstat.theory.kernels.peaks`: what lets a later selection at a high
    threshold skip most of ``x``); None where another form runs."""
    if summary.form_for(x, absolute, extremes, squares, logs) == "triton":
        try:
            return triton_stats.summary_and_peaks(x, *_checked_summary(absolute, extremes, squares, logs))
        except Exception as exc:  # noqa: BLE001 - a failed build or launch: reported once, the other forms run
            triton_stats.report(exc)
    return summary(x, absolute, extremes, squares, logs), None


@with_native(
    _native_tail,
    _tail_applies,
    TritonForm(
        triton_stats.tail_moments,
        triton_stats.runs_on,
        triton_stats.report,
        triton_stats.tail_in_graph if triton_stats.TAIL_OP is not None else None,
        triton_stats.in_graph,
    ),
)
def tail_moments(
    x: torch.Tensor, above: torch.Tensor, shift: torch.Tensor, inv_unit: torch.Tensor, logs: bool, squares: bool = True
) -> torch.Tensor:
    """Over the elements with ``|x| > above``: ``[n, sum z, sum z^2]`` (and ``sum log z`` when ``logs``), with
    ``z = (|x| - shift) * inv_unit``, as float64; without ``squares`` the sum of squares is not computed and stands
    at NaN (for a mean-only fit). ``above``, ``shift``, ``inv_unit``: 0-d float64 tensors.
    ``logs`` requires ``shift = 0``; each logarithm is of |x| itself, taken in x's dtype (a float64 logarithm per
    element would cost several read passes; |x| never underflows where z = |x| / unit would, for a vector that
    spans more than the dtype's exponent range), plus log(inv_unit) in float64, accumulated in float64."""
    a = x.abs().double()
    used = a > above
    z = torch.where(used, (a - shift) * inv_unit, 0.0)
    sum_sq = (z * z).sum() if squares else torch.full((), torch.nan, dtype=torch.float64, device=x.device)
    parts = [count_true(used), z.sum(), sum_sq]
    if logs:  # shift 0: log z = log |x| + log inv_unit, the log of |x| in x's dtype (finite for every nonzero x)
        log_a = torch.log(torch.where(used, x.abs(), 1.0)).double()
        parts.append(torch.where(used, log_a + torch.log(inv_unit), 0.0).sum())
    return torch.stack(parts)
