"""gradstat's own threshold estimator: a statistical threshold corrected with the count it selects.

Not from the papers; it keeps SIDCo's cost class (a handful of masked passes over |g|, no sort and no top-k) and
fixes what SIDCo leaves open: the fitted law is only approximately the gradients' law, so its threshold selects a
count k_hat that can be off by a factor of two on real gradients at small delta (SIDCo, Abdelmoniem et al.,
Sec. 4: estimation quality k_hat/k). Here the count is measured and the threshold corrected until it lies within
``[(1 - tol) k, (1 + tol) k]``:

1. anchor: the single-stage exponential threshold for delta_1 = max(delta, 1/4), eta_1 = mean|g| log(1/delta_1)
   (SIDCo Cor. 1.1, exponential closed form, at SIDCo's first-stage ratio, Sec. 4: one pass for the mean), which
   lies in the bulk where a fit is good and so selects more than k;
2. a peak-over-threshold step anchored on the *measured* count: the n exceedances of the threshold have mean excess
   b = mean(|g| - eta over |g| >= eta) (same pass as the count), and under an exponential tail above eta (SIDCo
   Cor. 2.1 (10)-(11)) the threshold that keeps k of them is eta + b log(n / k). Where SIDCo's later stages assume
   the count delta_m d, this uses the count itself; repeated while no threshold is known to select too few;
3. once the threshold is bracketed (one selecting too many, one too few): interpolation of log(count) linearly in
   the threshold between the two (exact for an exponential tail), with a bisection whenever the same end of the
   bracket moved twice in a row (the Illinois safeguard against a stalled regula falsi).

The band is at least k - 1 .. k + 1 (a band narrower than one element cannot be hit when k is small). At most
``max_counts`` counts; if the band is not reached, the measured threshold whose count came closest to k (reported
in ``payload.info["counts"]`` and ``["in_band"]``). Each count needs its value on the host (its steps, the
interpolation and the closest count are host decisions), so unlike RedSync's and GaussianKSGD's searches, which
a device runs queued (:func:`gradstat.compressors.schemes.sparsifiers.threshold.search_threshold_deferred`), it
waits for the device at every count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradstat.compressors.base import check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.degenerate import ExactFallback
from gradstat.compressors.schemes.sparsifiers.threshold import ThresholdSparsifier, threshold_properties
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels.primitives import count_excess, positive_threshold

FIRST_RATIO = 0.25
"""delta_1 of the anchor threshold (SIDCo Sec. 4: the first stage's ratio)."""


def count_and_excess(values: torch.Tensor, eta: torch.Tensor, signed: bool = False) -> tuple[int, torch.Tensor]:
    """The number n of nonzero ``|values| >= eta`` (host int: the search decides on it) and the sum of
    ``|values| - eta`` over them (0-d float64 tensor). ``values``: the magnitudes, or the signed vector when
    ``signed``; ``eta`` is rounded to their dtype first, as the selection compares. One fused read where compiled
    (or by Triton on CUDA); else a comparison, a count and a masked sum (the fused kernel's eager reference would
    cost float64 temporaries: ~4x slower on 1M elements)."""
    t = positive_threshold(eta, values)  # eta in the values' dtype, at least their smallest positive value
    if count_excess.fast_for(values):
        stats = count_excess(values, t.double())
        return int(stats[0]), stats[1]
    a = values.abs() if signed else values
    mask = a >= t
    return int(torch.count_nonzero(mask)), torch.where(mask, a - t, 0.0).sum().double()


def mean_magnitude(values: torch.Tensor, signed: bool = False) -> torch.Tensor:
    """mean |values| (0-d): a float64 sum from one fused read where compiled, else torch's float32 mean."""
    if count_excess.fast_for(values):
        return count_excess(values, torch.zeros((), dtype=torch.float64, device=values.device))[1] / values.numel()
    return (values.abs() if signed else values).mean()


def interpolate(low: tuple[torch.Tensor, int], high: tuple[torch.Tensor, int], k: int) -> torch.Tensor:
    """Threshold where log(count) reaches log(k) on the line through ``low`` = (eta, n > k) and ``high`` =
    (eta, n < k) (a count of 0 is read as 1/2); the midpoint when that is not strictly inside the bracket."""
    (e_lo, n_lo), (e_hi, n_hi) = low, high
    t = (math.log(n_lo) - math.log(k)) / (math.log(n_lo) - math.log(max(n_hi, 0.5)))
    guess = e_lo + t * (e_hi - e_lo)
    return guess if bool(guess > e_lo) and bool(guess < e_hi) else (e_lo + e_hi) / 2


@register("tailcount")
@dataclass
class TailCount(ExactFallback, ThresholdSparsifier):
    """ratio: target density delta in (0, 1). tol: accepted |k_hat/k - 1| (0.05). max_counts: at most this many
    counting passes (8). packed: bit-packed indices, else int32.
    exact_fallback: when the threshold selects none or every nonzero element, send the exact top-k instead
    (``payload.info["fallback"]`` says so; :mod:`gradstat.compressors.schemes.sparsifiers.degenerate`)."""

    ratio: float = 0.01
    tol: float = 0.05
    max_counts: int = 8
    packed: bool = True
    exact_fallback: bool = True

    properties = threshold_properties(
        "gradstat (count-corrected exponential threshold; SIDCo Cor. 1.1 and 2.1 for the first two steps)",
        bound="topk_contraction",
    )

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who="tailcount ratio")
        if not (0.0 < float(self.tol) < 1.0):
            raise ValueError(f"tailcount tol must lie in (0, 1), got {self.tol}")
        if isinstance(self.max_counts, bool) or int(self.max_counts) < 1:
            raise ValueError(f"tailcount max_counts must be an integer >= 1, got {self.max_counts}")

    def _signed_threshold(
        self, g: torch.Tensor, ctx: Context, payload: Payload, stats: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        # every statistic is a float64 sum of |g| (exactly 2^e times the normalised one): the same threshold
        return self._search(g, payload, signed=True) if count_excess.fast_for(g) else None

    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        return self._search(abs_g, payload, signed=False)

    def _search(self, abs_g: torch.Tensor, payload: Payload, signed: bool) -> torch.Tensor:
        """The count-corrected threshold over the magnitudes ``abs_g`` (of the signed vector when ``signed``)."""
        d = abs_g.numel()
        check_ratio(self.ratio, d, who="tailcount ratio")
        k = math.ceil(self.ratio * d)
        lo_n, hi_n = min((1.0 - self.tol) * k, k - 1.0), max((1.0 + self.tol) * k, k + 1.0)
        eta = mean_magnitude(abs_g, signed) * math.log(1.0 / max(self.ratio, FIRST_RATIO))
        if not bool(eta > 0):  # all zeros: nothing to send
            payload.info.update(counts=0, in_band=False)
            return torch.full((), math.inf, dtype=abs_g.dtype, device=abs_g.device)
        low: tuple[torch.Tensor, int] | None = None  # (threshold, count > (1 + tol) k)
        high: tuple[torch.Tensor, int] | None = None  # (threshold, count < (1 - tol) k)
        tried: list[tuple[torch.Tensor, int]] = []
        counts, in_band, last_side, repeats = 0, False, 0, 0
        for attempt in range(1, int(self.max_counts) + 1):
            counts = attempt
            n, excess = count_and_excess(abs_g, eta, signed)
            tried.append((eta, n))
            if lo_n <= n <= hi_n:
                in_band = True
                break
            side = 1 if n > hi_n else -1
            repeats = repeats + 1 if side == last_side else 0
            last_side = side
            if side > 0:
                low = (eta, n)
            else:
                high = (eta, n)
            if low is not None and high is not None:
                eta = (low[0] + high[0]) / 2 if repeats else interpolate(low, high, k)
            elif low is not None:
                eta = eta + excess / n * math.log(n / k)  # POT step anchored on the measured count
            else:
                eta = eta / 2  # nothing selected yet: halve until something is
        if not in_band:  # out of counts: the measured threshold whose count came closest to k
            eta = min(tried, key=lambda p: abs(math.log(max(p[1], 0.5) / k)))[0]
        payload.info.update(counts=counts, in_band=in_band)
        return eta
