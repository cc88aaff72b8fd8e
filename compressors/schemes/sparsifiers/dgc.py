"""Sampled-threshold sparsifiers: DGC's threshold from a random sample, and GMC's approximate top-K.

Both estimate the top-k threshold from a random subset S of the coordinates: eta = the ceil(delta |S|)-th largest
magnitude of S, then select ``|g| >= eta`` over the whole vector (one home:
:mod:`gradstat.compressors.schemes.sparsifiers.threshold`).

- ``dgc`` (Lin et al., "Deep Gradient Compression", ICLR 2018, Sec. 3 / reference implementation; as described in
  SIDCo (Abdelmoniem et al.), Sec. 1 and its footnote 2): sample about 1 % of the coordinates (with
  replacement), top-k of the sample gives eta; when more than ``fallback * k`` coordinates pass, exact top-k among
  the ones that passed (the second top-k of the footnote), so k_hat <= fallback * k.
- ``gmc_topk`` (GMC (Zhao et al.), Sec. 5 "approximate top-K strategy"): |S| = 0.01 d indexes drawn
  without replacement, theta such that |{j in S : |a_j| >= theta}| = delta |S| (the paper's example: 0.001 |S|),
  then every index with ``|a_j| >= theta``; no fallback, k_hat is only approximately delta d.

Both keep the k_hat largest magnitudes, so ``||C(g) - g||^2 <= (1 - k_hat/d) ||g||^2``.
The sample is drawn from the call's seed; the receiver needs only indices and values.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from gradstat.compressors import graphs
from gradstat.compressors.base import check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.pending import deferring
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.queued import Queued, capacity
from gradstat.compressors.schemes.sparsifiers.randk import random_k_indices
from gradstat.compressors.schemes.sparsifiers.threshold import ThresholdSparsifier, threshold_properties
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels import counter_dither
from gradstat.theory.kernels.primitives import selects_signed

SAMPLE_STREAM = 6
"""Sub-stream of the call seed for DGC's sample with replacement (random-k's subset uses 5)."""


def sampled_threshold(
    abs_g: torch.Tensor, ratio: float, sample_ratio: float, seed: int, replacement: bool
) -> torch.Tensor:
    """Top-k threshold estimated on a random sample: the ceil(ratio n)-th largest of n = ceil(sample_ratio d)
    sampled magnitudes (n at least 1, at most d without replacement). Returns a 0-d tensor on ``abs_g``'s device.
    ``abs_g`` may be the magnitudes or the signed vector (only the sample's magnitudes are formed). Without
    replacement, random-k's subset (:func:`~gradstat.compressors.schemes.sparsifiers.randk.random_k_indices`: off
    the CPU its bounded form, whose condition is read back, or kept under
    :func:`~gradstat.compressors.pending.deferring`)."""
    d = abs_g.numel()
    n = max(1, math.ceil(sample_ratio * d))
    if replacement:  # the counter hash of (seed, SAMPLE_STREAM): the same sample on every device
        idx = counter_dither.indices(n, d, counter_dither.keys(seed, SAMPLE_STREAM, abs_g.device), abs_g.device)
    else:
        idx = random_k_indices(d, min(n, d), seed, abs_g.device)
    sample = abs_g[idx].abs_()  # (a no-op on magnitudes; ``abs_g`` may also be the signed vector)
    k_sample = max(1, math.ceil(ratio * sample.numel()))
    return torch.topk(sample, k_sample, sorted=False).values.min()


def subset_failed(values: list[float], payload: Payload) -> bool:
    """``settle`` of a sampled threshold: True (the synchronous encode runs instead) where a bounded subset's
    condition, read back, is false (none read for a sample with replacement or on a CPU)."""
    return not all(values)


@dataclass
class _SampledThreshold(ThresholdSparsifier):
    ratio: float = 0.01
    sample_ratio: float = 0.01
    packed: bool = True

    replacement = True

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who=f"{self.name} ratio")
        if not (0.0 < float(self.sample_ratio) <= 1.0):
            raise ValueError(f"{self.name} sample_ratio must lie in (0, 1], got {self.sample_ratio}")

    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        check_ratio(self.ratio, abs_g.numel(), who=f"{self.name} ratio")
        return sampled_threshold(abs_g, self.ratio, self.sample_ratio, ctx.call_seed, self.replacement)

    def _queued(self, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor | None, Queued, int] | None:
        """The sampled threshold on the device (nothing of it is read back); the selection's buffer
        (:func:`~gradstat.compressors.schemes.sparsifiers.queued.capacity`) is sized for what passes it, at most
        ``fallback`` k where DGC keeps all that passed: DGC's exact top-k of a larger selection runs on the buffer
        once its count is read back (:meth:`_refine`). The largest magnitude (the finiteness check) is left to the
        selection's count, which finds it on its read of ``g``: one read pass fewer."""
        d = g.numel()
        check_ratio(self.ratio, d, who=f"{self.name} ratio")
        with deferring() as conditions:  # (a sample without replacement off the CPU: its bounded subset's)
            eta = sampled_threshold(g, self.ratio, self.sample_ratio, ctx.call_seed, self.replacement)
        reads = torch.stack(conditions).double() if conditions else torch.empty(0, dtype=torch.float64, device=g.device)
        return None, Queued(eta, reads, subset_failed), capacity(d, self._kept(d))

    def _graph_key(self, ctx: Context, x: torch.Tensor | None = None) -> Hashable | None:
        """The settings only: the sample is drawn from the counter hash's keys of the call seed, which a graph's
        replay refills (:mod:`gradstat.compressors.graphs`)."""
        return graphs.hyper_key(self)

    def _kept(self, d: int) -> int:
        """The most elements a selection keeps without a further cut: k here; ``fallback`` k for DGC."""
        return math.ceil(self.ratio * d)

    def _signed_threshold(
        self, g: torch.Tensor, ctx: Context, payload: Payload, stats: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        # the sampled magnitudes of g are 2^e times the normalised ones, so the threshold is too (exact)
        if not selects_signed(g):
            return None
        return self._threshold(g, g, ctx, payload)


@register("dgc")
@dataclass
class DGC(_SampledThreshold):
    """ratio: target density delta in (0, 1). sample_ratio: sampled fraction of coordinates (DGC: 1 %).
    fallback: when more than ``fallback * k`` pass the sampled threshold, keep the exact top-k of those
    (>= 1; DGC's reference code uses 1, i.e. any excess). packed: bit-packed indices, else int32."""

    fallback: float = 1.0

    properties = threshold_properties(
        "Lin et al. 2018 (DGC); SIDCo (Abdelmoniem et al.) Sec. 1 and footnote 2",
        randomized=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (float(self.fallback) >= 1.0) or math.isinf(self.fallback):
            raise ValueError(f"dgc fallback must be a finite factor >= 1, got {self.fallback}")

    def _graph_key(self, ctx: Context, x: torch.Tensor | None = None) -> Hashable | None:
        """The settings only: the sample is drawn from the counter hash's keys of the call seed, which a graph's
        replay refills (:mod:`gradstat.compressors.graphs`)."""
        return graphs.hyper_key(self)

    def _kept(self, d: int) -> int:
        return math.floor(self.fallback * math.ceil(self.ratio * d))

    def _refine(self, abs_g: torch.Tensor, indices: torch.Tensor, payload: Payload, ctx: Context) -> torch.Tensor:
        k = math.ceil(self.ratio * abs_g.numel())
        passed = indices.numel()  # host count: the fallback is a scalar decision of the algorithm
        payload.info["passed"] = passed
        if passed <= self.fallback * k:
            return indices
        return indices[torch.topk(abs_g.index_select(0, indices).abs_(), k, sorted=False).indices]


@register("gmc_topk")
@dataclass
class GMCTopK(_SampledThreshold):
    """ratio: target density delta in (0, 1) (GMC's example 0.001). sample_ratio: |S|/d (GMC: 0.01), drawn without
    replacement. packed: bit-packed indices, else int32."""

    replacement = False
    properties = threshold_properties(
        "GMC (Zhao et al.) Sec. 5 (approximate top-K strategy)",
        randomized=True,
    )
