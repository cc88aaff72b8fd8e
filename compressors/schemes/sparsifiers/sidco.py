"""SIDCo: threshold sparsification with a threshold from a multi-stage sparsity-inducing-distribution fit.

SIDCo (Abdelmoniem et al.): Sec. 2.3-2.4 (single- and multi-stage threshold estimators, Lemma 2 and Cor. 2.1),
Sec. 3 and Algorithm 1 (stage adaptation), Sec. 4 (delta_1 = 0.25, eps = 20 %, Q = 5). The fits and thresholds
are :func:`gradstat.theory.pot.multistage_threshold` (no estimator lives here); this module adds the compressor
around it: select ``|g| >= eta_M`` (Algorithm 1, line 8; :mod:`gradstat.compressors.schemes.sparsifiers.threshold`) and
the per-worker stage adaptation.

Variants (``dist``; named by what they fit, the paper's names being inconsistent between Sec. 4.1 and App. E/F):
``exp`` multi-stage exponential; ``gamma`` gamma first stage then generalized Pareto; ``gp`` generalized Pareto at
every stage. ``anchor``: the stages fit the exceedances shifted by the previous threshold (the paper) or by the
smallest survivor (the SIDCo authors' code).

Stage adaptation (``stages="adaptive"``): the worker's :class:`SIDCoState` averages the estimation quality
q = k_hat / (delta d) over Q calls and, when the average leaves [1 - eps, 1 + eps] (eq. (12)), chooses another M by
the rule ``adapt``: ``"error"`` (default), a search over [1, max_stages] that explores before it reverses and says
when no M meets the tolerance, or ``"paper"``, Algorithm 1 as printed (M - 1 when q > 1 + eps, M + 1 when
q < 1 - eps; from M = 1 on heavier-than-exponential gradients it stays at one stage). The rules live in
:mod:`gradstat.compressors.schemes.sparsifiers.stage_adaptation`.

Without a state (``ctx.state is None``) an adaptive SIDCo runs with ``initial_stages`` and learns nothing.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

import torch

from gradstat.compressors import graphs
from gradstat.compressors.base import check_ratio
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.degenerate import ExactFallback
from gradstat.compressors.schemes.sparsifiers.queued import Queued, capacity
from gradstat.compressors.schemes.sparsifiers.stage_adaptation import StageState as SIDCoState
from gradstat.compressors.schemes.sparsifiers.stage_adaptation import record
from gradstat.compressors.schemes.sparsifiers.threshold import Narrowed, ThresholdSparsifier, threshold_properties
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.distributions.names import distribution_name
from gradstat.theory.estimators.magnitudes import ConstantMagnitudes
from gradstat.theory.estimators.registry import SHAPED
from gradstat.theory.kernels.primitives import (
    gather_at_least,
    max_abs,
    normalise_by_pow2,
    pow2_exponent,
    scale_by_pow2,
    selects_signed,
)
from gradstat.theory.kernels.stage_stats import summary, summary_and_peaks, tail_moments
from gradstat.theory.pot import PotResult, deferred_threshold, multistage_threshold


@register("sidco")
@dataclass
class SIDCo(ExactFallback, ThresholdSparsifier):
    """ratio: target density delta in (0, 1). dist: first-stage law, ``exponential`` | ``gamma`` | ``genpareto``
    (aliases ``exp``, ``laplace``, ``gp``).
    stages: a fixed number of stages M >= 1, or ``adaptive``. first_ratio: delta_1 of the first stage (0.25).
    eps: tolerance on k_hat/k (0.2). period: Q, calls between adaptations (5). initial_stages, max_stages: the
    adaptive M starts at and stays within [1, max_stages]. adapt: ``error`` | ``paper`` (see module docstring).
    anchor: ``threshold`` | ``min_survivor``. method: ``closed_form`` (paper) | ``mle`` estimators.
    quantile: ``exact`` fitted quantile (Lemma 1 (4)-(5)) | ``approx``, the paper's gamma approximation
    -beta (log delta + log Gamma(alpha)) (Cor. 1.2 (15); differs from exact only for the gamma first stage).
    packed: bit-packed indices, else int32.
    exact_fallback: when the threshold selects none or every nonzero element, send the exact top-k instead
    (``payload.info["fallback"]`` says so; :mod:`gradstat.compressors.schemes.sparsifiers.degenerate`)."""

    ratio: float = 0.01
    dist: str = "exponential"
    stages: int | Literal["adaptive"] = "adaptive"
    first_ratio: float = 0.25
    eps: float = 0.2
    period: int = 5
    initial_stages: int = 1
    max_stages: int = 8
    adapt: Literal["error", "paper"] = "error"
    anchor: Literal["threshold", "min_survivor"] = "threshold"
    method: Literal["closed_form", "mle"] = "closed_form"
    quantile: Literal["exact", "approx"] = "exact"
    packed: bool = True
    exact_fallback: bool = True

    properties = threshold_properties(
        "SIDCo (Abdelmoniem et al.) Sec. 2.3-2.4, 3, Algorithm 1",
        bound="topk_contraction",
    )

    def __post_init__(self) -> None:
        check_ratio(self.ratio, who="sidco ratio")
        check_ratio(self.first_ratio, who="sidco first_ratio")
        self.dist = distribution_name(self.dist, "sidco dist")
        for key, allowed in (
            ("adapt", ("error", "paper")),
            ("anchor", ("threshold", "min_survivor")),
            ("method", ("closed_form", "mle")),
            ("quantile", ("exact", "approx")),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(f"sidco {key} must be one of {', '.join(allowed)}, got {getattr(self, key)!r}")
        if self.stages != "adaptive" and (
            isinstance(self.stages, bool) or not isinstance(self.stages, int) or self.stages < 1
        ):
            raise ValueError(f"sidco stages must be an integer >= 1 or 'adaptive', got {self.stages!r}")
        if not (0.0 <= float(self.eps) < 1.0):
            raise ValueError(f"sidco eps must lie in [0, 1), got {self.eps}")
        if int(self.period) < 1:
            raise ValueError(f"sidco period (Q) must be >= 1, got {self.period}")
        if not (1 <= int(self.initial_stages) <= int(self.max_stages)):
            raise ValueError(
                f"sidco needs 1 <= initial_stages <= max_stages, got {self.initial_stages} and {self.max_stages}"
            )

    def new_state(self, like: torch.Tensor | None = None) -> SIDCoState | None:
        """A fresh per-worker (per-tensor) state for adaptive stages; None for a fixed M."""
        return SIDCoState(stages=int(self.initial_stages)) if self.stages == "adaptive" else None

    def stage_count(self, state: SIDCoState | None) -> int:
        """M for the next call: the fixed M, else the state's (``initial_stages`` without a state), and 1 when
        the target ratio is not below delta_1 (a second stage would need delta_2 > 1)."""
        m = self.stages if self.stages != "adaptive" else (state.stages if state is not None else self.initial_stages)
        return 1 if self.stages == "adaptive" and self.ratio >= self.first_ratio else int(m)

    reads_summary = True

    def _summary(self, g: torch.Tensor) -> torch.Tensor:
        return summary(g, True, *self._summary_flags())

    def _summary_flags(self) -> tuple[bool, bool, bool]:
        # the minima only for a shaped first stage (its spread check); the sum of squares only for the generalized
        # Pareto's variance, the sum of logarithms only for the gamma (the exponential needs max, count and sum)
        return self.dist in SHAPED, self.dist == "genpareto", self.dist == "gamma"

    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        return self._fit(abs_g, ctx, payload, signed=False, original=g).threshold

    def _signed_threshold(
        self, g: torch.Tensor, ctx: Context, payload: Payload, stats: torch.Tensor | None = None
    ) -> torch.Tensor | Narrowed | None:
        if not tail_moments.fast_for(g, None, None, None, self.dist == "gamma"):  # (gamma: stage 1 reads logs)
            return None
        pot = self._fit(g, ctx, payload, signed=True, stats=stats, narrow=selects_signed(g))
        if pot.candidates is None or pot.candidate_magnitudes is None:
            return pot.threshold
        return Narrowed(pot.threshold, pot.candidates, pot.candidate_magnitudes)

    def _queued(self, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor, Queued, int] | None:
        """The closed-form stages on the device (:func:`gradstat.theory.pot.deferred_threshold`), read back with the
        selection; the MLE's stages compact their exceedances, and run synchronously. The stages read what the
        synchronous encode's read: ``g`` itself where the fused statistics run (:meth:`_signed_threshold`), else its
        magnitudes normalised by the power of two at the largest (the threshold scaled back exactly)."""
        if self.method != "closed_form":
            return None
        d = g.numel()
        check_ratio(self.ratio, d, who="sidco ratio")
        state = ctx.state if isinstance(ctx.state, SIDCoState) else None
        m = self.stage_count(state)
        # (with the sub-block maxima of |g| where the Triton summary reads it: the selection skips most of g)
        stats, peaks = summary_and_peaks(g, True, *self._summary_flags())
        signed = tail_moments.fast_for(g, None, None, None, self.dist == "gamma")
        e = None if signed else pow2_exponent(stats[1])
        pot = deferred_threshold(
            g if e is None else normalise_by_pow2(g.abs(), e),
            self.ratio,
            m,
            first=self.dist,
            first_ratio=self.first_ratio,
            anchor=self.anchor,
            quantile=self.quantile,
            signed=signed,
            stats=stats if signed else None,
        )

        def settle(values: list[float], payload: Payload) -> bool:
            exact_path, reason = pot.settle(values)
            if not exact_path:
                payload.info.update(stages=m, stopped_reason=reason)
            return exact_path

        threshold = pot.threshold if e is None else scale_by_pow2(pot.threshold, e)
        queued = Queued(threshold, pot.reads, settle, peaks if g.dim() == 1 else None)
        return stats[1], queued, capacity(d, math.ceil(self.ratio * d))

    def _graph_key(self, ctx: Context, x: torch.Tensor | None = None) -> Hashable | None:
        """The settings and the stage count M (the state's, where adaptive): all that :meth:`_queued` reads besides
        the gradient (its closed-form stages only; the MLE's run synchronously)."""
        if self.method != "closed_form":
            return None
        hyper = graphs.hyper_key(self)
        state = ctx.state if isinstance(ctx.state, SIDCoState) else None
        return None if hyper is None else (hyper, self.stage_count(state))

    def _fit(
        self,
        x: torch.Tensor,
        ctx: Context,
        payload: Payload,
        signed: bool,
        stats: torch.Tensor | None = None,
        narrow: bool = False,
        original: torch.Tensor | None = None,
    ) -> PotResult:
        """The multi-stage fit of ``|x|`` (``x`` signed or magnitudes), its threshold eta_M; with ``narrow``, the
        last stage runs on the elements above eta_{M-1}, gathered once (:class:`PotResult` ``candidates``).
        ``original``: the gradient in its own units when ``x`` is normalised (for messages).

        Constant nonzero magnitudes leave a shaped first stage without a shape: with ``exact_fallback`` the
        threshold is that magnitude (every nonzero element tied: the exact top-k takes the first k by index and
        ``payload.info["fallback"]`` says why), else a ValueError giving the magnitude in the gradient's units."""
        check_ratio(self.ratio, x.numel(), who="sidco ratio")
        state = ctx.state if isinstance(ctx.state, SIDCoState) else None
        m = self.stage_count(state)
        try:
            pot = multistage_threshold(
                x,
                self.ratio,
                m,
                first=self.dist,
                first_ratio=self.first_ratio,
                anchor=self.anchor,
                method=self.method,
                quantile=self.quantile,
                signed=signed,
                final_count=False,  # the selection counts it
                stats=stats,
                narrow=exceedances_above if narrow else None,
                details=False,  # (the encode reads the threshold and the reason only)
            )
        except ConstantMagnitudes as exc:
            value = float(max_abs(original)) if original is not None else exc.value
            why = f"every nonzero |g| is {value} ({exc.count} elements): a {self.dist} fit has no shape"
            if not self.exact_fallback:
                raise ValueError(f"sidco ({self.dist}, {m} stages): {why}") from None
            payload.info.update(stages=m, stopped_reason=why, fallback=f"exact top-k: {why}")
            return PotResult(torch.full((), exc.value, dtype=torch.float64, device=x.device), [], why)
        except ValueError as exc:
            raise ValueError(f"sidco ({self.dist}, {m} stages): {exc}") from None
        payload.info.update(stages=m, stopped_reason=pot.stopped_reason)
        return pot

    def _refine(self, abs_g: torch.Tensor, indices: torch.Tensor, payload: Payload, ctx: Context) -> torch.Tensor:
        """Learn from the count selected by eta_M (k_hat before ties are resolved): the adaptive stages' q; then the
        exact top-k where that selection is degenerate (:class:`ExactFallback`)."""
        if isinstance(ctx.state, SIDCoState):
            used = payload.info["stages"]
            assert isinstance(used, int)  # set by _fit just before
            self._adapt(ctx.state, indices.numel() / (self.ratio * abs_g.numel()), used)
        return super()._refine(abs_g, indices, payload, ctx)

    def _adapt(self, state: SIDCoState, quality: float, used: int) -> None:
        """Record q = k_hat/(delta d) for this call and, every Q calls, choose M (SIDCo Algorithm 1, Adapt_Stages)."""
        record(state, quality, used, int(self.period), float(self.eps), int(self.max_stages), self.adapt)


def exceedances_above(x: torch.Tensor, t: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """Increasing indices and magnitudes of the nonzero elements with ``|x| >= t`` (``t`` in x's dtype): the
    exceedances of ``t`` and the ties at it, which a last stage that keeps ``t`` selects (``|x| >= eta``)."""
    return gather_at_least(x, t, signed=True)
