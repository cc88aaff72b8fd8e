"""GaussianKSGD's threshold: a Gaussian fit of g, then iterative adjustment of the threshold.

Shi, Chu, Cheung, See, "Understanding Top-k Sparsification in Distributed Deep Learning" (2019), gTop-k /
GaussianK: model g_i ~ N(mu, sigma^2) with the sample mean and standard deviation, take the two-sided quantile
eta_0 = |mu| + sigma Phi^{-1}(1 - delta/2) (exact for mu = 0: P(|G| >= eta_0) = delta), then adjust while the
selected count is outside ``[band_low k, band_high k]`` (the SIDCo authors' baseline: 2/3 and 4/3, at most 5
rounds); a baseline in SIDCo (Abdelmoniem et al.), Sec. 1.

Done right (see :func:`gradstat.compressors.schemes.sparsifiers.threshold.search_threshold`): the selection is on |g|
(not on positive values only), every adjustment moves towards the band (halving/doubling until bracketed, then
bisection, instead of the baseline's fixed x0.5 / x1.5 steps that can overshoot back and forth), and the number of
rounds is bounded, so constant or all-zero input (sigma = 0) cannot loop forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import torch

from gradstat.compressors.base import check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.queued import Queued
from gradstat.compressors.schemes.sparsifiers.threshold import (
    ThresholdSparsifier,
    queued_search,
    search_threshold,
    threshold_properties,
)
from gradstat.compressors.wire.payload import Payload


@register("gaussianksgd")
@dataclass
class GaussianKSGD(ThresholdSparsifier):
    """ratio: target density delta in (0, 1). band_low, band_high: accepted k_hat/k range (baseline: 2/3, 4/3).
    max_iter: at most this many counts (baseline: 5). packed: bit-packed indices, else int32."""

    ratio: float = 0.01
    band_low: float = 2.0 / 3.0
    band_high: float = 4.0 / 3.0
    max_iter: int = 5
    packed: bool = True

    properties = threshold_properties(
        "Shi et al. 2019 (GaussianK); SIDCo (Abdelmoniem et al.) Sec. 1 baseline",
    )

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who="gaussianksgd ratio")
        if not (0.0 < float(self.band_low) <= 1.0 <= float(self.band_high) < math.inf):
            raise ValueError(
                f"gaussianksgd band must satisfy 0 < band_low <= 1 <= band_high < inf, "
                f"got band_low={self.band_low}, band_high={self.band_high}"
            )
        if int(self.max_iter) < 1:
            raise ValueError(f"gaussianksgd max_iter must be >= 1, got {self.max_iter}")

    needs_signed = True  # the Gaussian fit reads the mean and standard deviation of g

    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        d = g.numel()
        check_ratio(self.ratio, d, who="gaussianksgd ratio")
        z = NormalDist().inv_cdf(1.0 - self.ratio / 2.0)
        std, mean = torch.std_mean(g, correction=0)
        eta, steps = search_threshold(
            abs_g, math.ceil(self.ratio * d), mean.abs() + z * std, (self.band_low, self.band_high), self.max_iter
        )
        payload.info["search_steps"] = steps
        return eta

    def _queued(self, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor, Queued, int] | None:
        """The same search with its decisions on the device (every one of ``max_iter`` counts made), read back with
        the selection (:func:`~gradstat.compressors.schemes.sparsifiers.threshold.queued_search`)."""
        d = g.numel()
        check_ratio(self.ratio, d, who="gaussianksgd ratio")
        z = NormalDist().inv_cdf(1.0 - self.ratio / 2.0)

        def start(g_n: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            std, mean = torch.std_mean(g_n, correction=0)
            return mean.abs() + z * std, {}

        band = (self.band_low, self.band_high)
        return queued_search(g, math.ceil(self.ratio * d), start, band, self.max_iter, self.needs_signed)
