"""RedSync's threshold: bisection between the mean and the maximum of |g|.

Fang, Fu, Yang, Hsieh, "RedSync: Reducing synchronization bandwidth for distributed deep learning training
system", JPDC 133 (2019), trimmed top-k selection; a baseline in SIDCo (Abdelmoniem et al.), Sec. 1 ("finds
the threshold by moving the ratio between the maximum and mean values of the gradient").

eta = mean|g| + r (max|g| - mean|g|), r in [0, 1] found by bisection until the selected count k_hat lies in
``[k, band k]`` or ``max_iter`` counts were made. Done right, unlike the SIDCo authors' baseline code: their
search raises the threshold when k/2 <= k_hat <= k (too few selected already), moving it away from the target;
here too many always raises it and too few always lowers it
(:func:`gradstat.compressors.schemes.sparsifiers.threshold.search_threshold`). When even eta = mean|g| selects fewer
than k (a dense gradient, or a large delta) the search ends at the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradstat.compressors.base import check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.degenerate import ExactFallback
from gradstat.compressors.schemes.sparsifiers.queued import Queued
from gradstat.compressors.schemes.sparsifiers.threshold import (
    ThresholdSparsifier,
    queued_search,
    search_threshold,
    threshold_properties,
)
from gradstat.compressors.wire.payload import Payload


@register("redsync")
@dataclass
class RedSync(ExactFallback, ThresholdSparsifier):
    """ratio: target density delta in (0, 1). band: accepted k_hat/k upper end (k_hat in [k, band k]; RedSync: 2).
    max_iter: at most this many bisection counts. packed: bit-packed indices, else int32.
    exact_fallback: when the threshold selects none or every nonzero element, send the exact top-k instead
    (``payload.info["fallback"]`` says so; :mod:`gradstat.compressors.schemes.sparsifiers.degenerate`)."""

    ratio: float = 0.01
    band: float = 2.0
    max_iter: int = 20
    packed: bool = True
    exact_fallback: bool = True

    properties = threshold_properties(
        "Fang et al. 2019 (RedSync); SIDCo (Abdelmoniem et al.) Sec. 1 baseline",
    )

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who="redsync ratio")
        if not (float(self.band) >= 1.0) or math.isinf(self.band):
            raise ValueError(f"redsync band must be a finite factor >= 1, got {self.band}")
        if int(self.max_iter) < 1:
            raise ValueError(f"redsync max_iter must be >= 1, got {self.max_iter}")

    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        d = abs_g.numel()
        check_ratio(self.ratio, d, who="redsync ratio")
        mean, top = abs_g.mean(), abs_g.max()
        eta, steps = search_threshold(
            abs_g, math.ceil(self.ratio * d), (mean + top) / 2, (1.0, self.band), self.max_iter, low=mean, high=top
        )
        payload.info["search_steps"] = steps
        return eta

    def _queued(self, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor, Queued, int] | None:
        """The same search with its decisions on the device (every one of ``max_iter`` counts made), read back with
        the selection (:func:`~gradstat.compressors.schemes.sparsifiers.threshold.queued_search`)."""
        d = g.numel()
        check_ratio(self.ratio, d, who="redsync ratio")

        def start(_: torch.Tensor, abs_g: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            mean, top = abs_g.mean(), abs_g.max()
            return (mean + top) / 2, {"low": mean, "high": top}

        k = math.ceil(self.ratio * d)
        return queued_search(g, k, start, (1.0, self.band), self.max_iter, self.needs_signed)
