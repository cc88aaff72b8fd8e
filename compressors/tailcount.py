"""gradstat's own threshold estimator: a statistical threshold corrected with the count it selects.

Not from the papers; it keeps SIDCo's cost class (a handful of masked passes over |g|, no sort and no top-k) and
fixes what SIDCo leaves open: the fitted law is only approximately the gradients' law, so its threshold selects a
count k_hat that can be off by a factor of two on real gradients at small delta (SIDCo, Abdelmoniem et al.,
Sec. 4: estimation quality k_hat/k). Here the count is measured and the threshold corrected until it lies within
``[(1 - tol) k, (1 + tol) k]``:

1. start: the single-stage exponential threshold eta_0 = mean|g| log(1/delta) (SIDCo Cor. 1.1, exponential
   closed form; one pass for the mean);
2. first correction, a peak-over-threshold step anchored on the *measured* count: the n_0 exceedances of eta_0
   have mean excess b = mean(|g| - eta_0 over |g| >= eta_0) (the same pass as the count), and under an
   exponential tail above eta_0 (SIDCo Cor. 2.1 (10)-(11)) the threshold that keeps k of them is
   eta_1 = eta_0 + b log(n_0 / k). Where SIDCo's second stage assumes n_0 = delta_1 d, this uses the count itself;
3. later corrections: a secant step on log(count) against log(threshold) through the last two measurements (a
   locally Pareto tail), kept inside the bracket of thresholds known to select too many / too few, and bisection
   of the bracket when the secant step leaves it.

At most ``max_counts`` counts; the last threshold is used if the band is not reached (reported in
``payload.info["counts"]`` and ``["in_band"]``). Each count needs its value on the host, the same inherent
synchronisation as RedSync's and GaussianKSGD's searches (:func:`gradstat.compressors.threshold.search_threshold`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradstat.compressors.base import Properties, check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.payload import Payload
from gradstat.compressors.registry import register
from gradstat.compressors.threshold import THRESHOLD_CONTRACTION, ThresholdSparsifier


def count_and_excess(abs_g: torch.Tensor, eta: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The number n of nonzero ``abs_g >= eta`` (host int: the search decides on it) and the sum of
    ``abs_g - eta`` over them (0-d tensor), in one masked pass."""
    mask = (abs_g >= eta) & (abs_g > 0)
    n = int(mask.sum())
    return n, torch.where(mask, abs_g - eta, torch.zeros_like(abs_g)).sum()


def next_threshold(
    points: list[tuple[torch.Tensor, int]], k: int, low: torch.Tensor | None, high: torch.Tensor | None
) -> torch.Tensor:
    """Secant step on (log eta, log n) through the last two measured points towards n = k, clipped to the bracket
    ``(low, high)`` (thresholds known to select too many / too few); bisection when it leaves the bracket or the two
    points cannot define a slope."""
    (e1, n1), (e2, n2) = points[-2], points[-1]
    guess: torch.Tensor | None = None
    if n1 > 0 and n2 > 0 and n1 != n2 and bool(e1 > 0) and bool(e2 > 0) and bool(e1 != e2):
        slope = (math.log(n2) - math.log(n1)) / (torch.log(e2) - torch.log(e1))
        guess = torch.exp(torch.log(e2) + (math.log(k) - math.log(n2)) / slope)
    inside = guess is not None and bool(torch.isfinite(guess))
    inside = inside and (low is None or bool(guess > low)) and (high is None or bool(guess < high))
    if inside:
        return guess
    if low is not None and high is not None:
        return (low + high) / 2
    return high / 2 if low is None else low * 2


@register("tailcount")
@dataclass
class TailCount(ThresholdSparsifier):
    """ratio: target density delta in (0, 1). tol: accepted |k_hat/k - 1| (0.05). max_counts: at most this many
    counting passes (6). packed: bit-packed indices, else int32."""

    ratio: float = 0.01
    tol: float = 0.05
    max_counts: int = 6
    packed: bool = True

    properties = Properties(
        kind="sparsifier",
        unbiased=False,
        randomized=False,
        contraction=THRESHOLD_CONTRACTION,
        bound="topk_contraction",
        source="gradstat (count-corrected exponential threshold; SIDCo Cor. 1.1 and 2.1 for the first two steps)",
    )

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who="tailcount ratio")
        if not (0.0 < float(self.tol) < 1.0):
            raise ValueError(f"tailcount tol must lie in (0, 1), got {self.tol}")
        if isinstance(self.max_counts, bool) or int(self.max_counts) < 1:
            raise ValueError(f"tailcount max_counts must be an integer >= 1, got {self.max_counts}")

    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        d = g.numel()
        check_ratio(self.ratio, d, who="tailcount ratio")
        k = math.ceil(self.ratio * d)
        lo_n, hi_n = (1.0 - self.tol) * k, (1.0 + self.tol) * k
        eta = abs_g.mean() * math.log(1.0 / self.ratio)
        if not bool(eta > 0):  # all zeros: nothing to send
            payload.info.update(counts=0, in_band=False)
            return torch.full((), math.inf, dtype=abs_g.dtype, device=abs_g.device)
        low: torch.Tensor | None = None  # selects too many
        high: torch.Tensor | None = None  # selects too few
        points: list[tuple[torch.Tensor, int]] = []
        counts, in_band = 0, False
        for counts in range(1, int(self.max_counts) + 1):
            n, excess = count_and_excess(abs_g, eta)
            if lo_n <= n <= hi_n:
                in_band = True
                break
            if n > hi_n:
                low = eta
            else:
                high = eta
            points.append((eta, n))
            if counts == int(self.max_counts):
                break
            if len(points) == 1 and n > 0:
                eta = eta + excess / n * math.log(n / k)  # POT step anchored on the measured count
                if (high is not None and not bool(eta < high)) or (low is not None and not bool(eta > low)):
                    eta = high / 2 if low is None else low * 2
            else:
                eta = next_threshold(points if len(points) > 1 else points * 2, k, low, high)
        if not in_band:  # out of counts: the measured threshold whose count came closest to k
            eta = min(points, key=lambda p: abs(math.log(max(p[1], 0.5) / k)))[0]
        payload.info.update(counts=counts, in_band=in_band)
        return eta
