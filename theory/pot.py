"""Multi-stage peak-over-threshold (PoT) threshold estimation of SIDCo.

SIDCo (Abdelmoniem et al.), Sec. 2.4: stage 1 fits |g| and takes the threshold eta_1 for a ratio delta_1;
stage m >= 2 fits the exceedances of eta_{m-1}, shifted by an anchor a_m, and takes eta_m = a_m + the fitted
quantile at delta_m, with prod_m delta_m = delta. Lemma 2 (7)-(9): generalized Pareto stages (moment matching on
|g_bar| - eta_{m-1}); Cor. 2.1 (10)-(11): exponential stages, beta_m = mean(|g_bar| - eta_{m-1}). The paper's anchor
is the previous threshold (``anchor="threshold"``); the SIDCo authors' code shifts by the smallest survivor
(``anchor="min_survivor"``). Variant names say what they do: exponential -> exponential, gamma -> genpareto,
genpareto -> genpareto (the paper's labels for the last two differ between Sec. 4.1 and App. E/F).

Every stage is a masked reduction over the full vector on its device; the stages run without reading anything back
(except the generalized Pareto MLE, which compacts its exceedances), and one synchronisation at the end reads the
survivor counts and diagnostics. On a CPU the stages' scalar arithmetic runs on host numbers instead of 0-d tensors
(:mod:`gradstat.theory.scalars`: the same expressions, without a tensor dispatch per operation); the results are
tensors either way. A caller that selects afterwards may pass ``narrow``: the last stage then runs on
the exceedances of eta_{M-1}, gathered once, and the caller selects among them (one pass over the whole vector in
place of two). A degenerate stage (fewer than two survivors, zero variance, non-finite fit) keeps
the previous threshold, ends the recursion and is reported in ``stopped_reason``.

:func:`deferred_threshold` is the same computation with the closed forms for a caller that must not synchronise
at all (a compressor's encode on an accelerator): stage 1's facts (count of non-zeros, largest magnitude) stay on
the device too, nothing is read, and the values the result is assembled from come back as one vector for the
caller to read with its own; inputs it does not represent (rejected data, too few non-zeros for stage 1) are
flagged there, for the caller to run :func:`multistage_threshold` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gradstat.theory import scalars as S
from gradstat.theory.estimators.estimate import Estimate
from gradstat.theory.estimators.exceedances import Exceedances, device_unit, direct_ok, unit_for
from gradstat.theory.estimators.fit import resolve
from gradstat.theory.estimators.magnitudes import check_magnitudes, device_facts, nonempty
from gradstat.theory.estimators.registry import SHAPED, Estimator, estimator
from gradstat.theory.estimators.result import Fit
from gradstat.theory.kernels.fused import Fused
from gradstat.theory.kernels.stage_stats import tail_moments
from gradstat.theory.thresholds import QUANTILES, check_length, check_ratio, conditional_ratio, tail_quantile

FIRST = ("exponential", "gamma", "genpareto")
LATER = ("exponential", "genpareto")
PAPER_LATER = {"exponential": "exponential", "gamma": "genpareto", "genpareto": "genpareto"}
ANCHORS = ("threshold", "min_survivor")
NARROW_FRACTION = 0.03
"""``narrow`` gathers the elements above eta_{M-1} only when their expected fraction, prod_{m<M} delta_m, is at
most this: a selection of more elements costs more than the last stage's pass it replaces."""


@dataclass
class StageResult:
    """One PoT stage: its ratio delta_m, threshold eta_m, fit and the count of |g| > eta_m (0-d int tensor; None for
    the last stage when not counted)."""

    ratio: float
    threshold: torch.Tensor
    fit: Fit
    survivors: torch.Tensor | None


@dataclass
class PotResult:
    """Final threshold (0-d tensor, keep |g| > threshold), the completed stages, and why it stopped early (or None)."""

    threshold: torch.Tensor
    stages: list[StageResult]
    stopped_reason: str | None
    candidates: torch.Tensor | None = None
    """With ``narrow``: the indices (increasing) of every nonzero element at or above the last stage's anchor
    threshold eta_{M-1}, a superset of those at or above the final threshold; None when the stages ran on the whole
    vector."""
    candidate_magnitudes: torch.Tensor | None = None
    """With ``candidates``: the magnitudes of those elements, in the same order."""


def stage_ratios(ratio: float, stages: int, first_ratio: float = 0.25) -> list[float]:
    """Per-stage ratios: delta_1 = first_ratio, then an equal geometric split of ratio / first_ratio.

    SIDCo Sec. 2.4 (delta = prod_m delta_m; two stages: delta_2 = delta / delta_1) and Sec. 4 (delta_1 = 0.25).
    One stage gives [ratio]. Raises ValueError for ratios outside (0, 1), stages < 1, or ratio >= first_ratio
    with stages >= 2.
    """
    ratio = check_ratio(ratio)
    first_ratio = check_ratio(first_ratio, "first_ratio")
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if stages == 1:
        return [ratio]
    if ratio >= first_ratio:
        raise ValueError(
            f"with stages={stages} the target ratio ({ratio}) must be below first_ratio "
            f"({first_ratio}); use stages=1 or a larger first_ratio"
        )
    rest = (ratio / first_ratio) ** (1.0 / (stages - 1))
    return [first_ratio] + [rest] * (stages - 1)


def _check_ratios(ratios: list[float], ratio: float, stages: int) -> list[float]:
    values = [check_ratio(r, "ratios[]") if r != 1 else 1.0 for r in ratios]
    if len(values) != stages:
        raise ValueError(f"ratios has {len(values)} entries but stages={stages}; give one ratio per stage")
    if not math.isclose(math.prod(values), ratio, rel_tol=1e-9):
        raise ValueError(f"the product of ratios {values} is {math.prod(values)}, not the target ratio {ratio}")
    return values


def _choice(value: str, accepted: tuple[str, ...], name: str) -> str:
    if value not in accepted:
        raise ValueError(f"{name} must be one of {list(accepted)}, got {value!r}")
    return value


def _later_method(method: str) -> str:
    """Estimator of stages >= 2: the MLE when asked for, else the closed forms of Lemma 2 / Cor. 2.1."""
    return "mle" if method == "mle" else "closed_form"


@dataclass
class _Stage:
    ratio: float
    threshold: S.Scalar
    estimate: Estimate
    count: S.Scalar  # used values (float64)
    ok: S.Flag  # this stage and all before it are valid
    n_zeros: int
    method: str
    dist: str
    note: str | None = None


def multistage_threshold(
    abs_g: object,
    ratio: float,
    stages: int,
    first: str = "exponential",
    later: str | None = None,
    first_ratio: float = 0.25,
    ratios: list[float] | None = None,
    anchor: str = "threshold",
    method: str = "closed_form",
    quantile: str = "exact",
    signed: bool = False,
    final_count: bool = True,
    stats: torch.Tensor | None = None,
    narrow: Callable[[torch.Tensor, torch.Tensor | float], tuple[torch.Tensor, torch.Tensor]] | None = None,
    details: bool = True,
) -> PotResult:
    """Threshold for a target ratio by M-stage peak over threshold (SIDCo Sec. 2.4, Lemma 2, Cor. 2.1).

    Parameters
    ----------
    abs_g : Tensor (any device) or numpy array
        Magnitudes |g| >= 0 (zeros allowed: stage 1 fits the non-zeros at the conditional ratio, see
        :mod:`gradstat.theory.thresholds`; when the non-zeros are fewer than delta_1 d, stage 1 keeps them all,
        threshold 0, and the later stages split the remaining ratio delta d / n equally).
    ratio : float in (0, 1)
        Target density delta over all elements.
    stages : int >= 1
        Number of stages M.
    first : {'exponential', 'gamma', 'genpareto'}
        Stage-1 distribution.
    later : {'exponential', 'genpareto'} or None
        Distribution of the shifted exceedances at stages >= 2; None: the paper's pairing (exponential after
        exponential, generalized Pareto after gamma or generalized Pareto).
    first_ratio : float
        delta_1 of :func:`stage_ratios` (ignored when ``ratios`` is given).
    ratios : list of float, optional
        Explicit per-stage ratios (length ``stages``, product ``ratio``).
    anchor : {'threshold', 'min_survivor'}
        Shift of the exceedances: the previous threshold (paper) or the smallest survivor (authors' code).
    method : str
        Estimator of stage 1 ('closed_form', 'mle', 'minka_newton' for gamma); later stages use 'mle' when it is
        'mle' and the closed forms otherwise.
    quantile : {'exact', 'approx'}
        Gamma quantile of stage 1 (see :func:`gradstat.theory.thresholds.tail_quantile`).
    signed : bool
        ``abs_g`` holds signed values g and the magnitudes are |g|: the statistics are read by fused kernels
        (:mod:`gradstat.theory.kernels.stage_stats`) without forming |g| (one read of g per stage where they run
        compiled); same thresholds as for ``abs(g)`` up to the rounding of reordered sums.
    final_count : bool
        Count the survivors of the final threshold (one more pass); False leaves the last stage's ``survivors``
        None, for a caller that selects with the threshold and counts there.
    stats : Tensor, optional
        The fused summary of ``abs_g`` (:func:`gradstat.theory.kernels.stage_stats.summary`, same ``signed``) when
        the caller has read it already (see :func:`gradstat.theory.estimators.magnitudes.check_magnitudes`).
    narrow : callable ``(x, t) -> (indices, magnitudes)``, optional
        With M >= 2 stages (and at most :data:`NARROW_FRACTION` of the elements expected above eta_{M-1}): the
        increasing indices of the nonzero elements with ``|x| >= t`` (``t`` in x's dtype: a 0-d tensor, or a host
        float holding that value where the fit runs on host numbers) and their magnitudes: the
        exceedances and the ties at ``t``, which a final threshold equal to eta_{M-1} selects. The
        elements above eta_{M-1} are then gathered once (one selection in place of the last stage's pass over the
        whole vector) and the last stage runs on them; their indices are returned as ``candidates`` (and their
        magnitudes as ``candidate_magnitudes``), from which the caller selects. Same statistics up to the order
        of their sums.
    details : bool
        Build each completed stage's :class:`StageResult` (its fit as a :class:`Fit`, threshold and survivors);
        False leaves ``stages`` empty and returns the threshold and the reason to stop only (a compressor's encode,
        which reads nothing else: on a small tensor the fits' objects cost more than the arithmetic).

    Returns
    -------
    PotResult
        ``threshold`` (0-d float64 tensor), the completed ``stages`` and ``stopped_reason`` (None when all M
        stages completed).
    """
    with np.errstate(all="ignore"):  # host scalars: inf and NaN as the tensors give them, without warnings
        return _multistage(
            abs_g, ratio, stages, first, later, first_ratio, ratios, anchor, method, quantile, signed, final_count,
            stats, narrow, details,
        )  # fmt: skip


@dataclass
class DeferredPot:
    """A multi-stage threshold computed on x's device without reading anything back (:func:`deferred_threshold`).

    Attributes
    ----------
    threshold : Tensor
        0-d float64 on x's device: eta_M in x's units (keep |g| > threshold); meaningless where :attr:`settle`
        says the input needs the synchronous path.
    reads : Tensor
        1-D float64 on x's device: every value :attr:`settle` needs, for the caller to read back with its own in
        one copy.
    settle : callable ``(values) -> (exact_path, stopped_reason)``
        From the values of :attr:`reads` as read back (same order): ``exact_path`` True where this form does not
        represent the input (the caller runs :func:`multistage_threshold`, which raises the proper errors and
        handles every edge case), else False and the reason the stages stopped early (None when every stage
        completed), exactly :attr:`PotResult.stopped_reason`.
    """

    threshold: torch.Tensor
    reads: torch.Tensor
    settle: Callable[[list[float]], tuple[bool, str | None]]


def deferred_threshold(
    x: torch.Tensor,
    ratio: float,
    stages: int,
    *,
    first: str = "exponential",
    first_ratio: float = 0.25,
    anchor: str = "threshold",
    quantile: str = "exact",
    signed: bool = False,
    stats: torch.Tensor | None = None,
) -> DeferredPot:
    """:func:`multistage_threshold` with the closed forms (``method="closed_form"`` at every stage, the paper's
    later law :data:`PAPER_LATER`), computed on x's device without reading anything back to the host: the launches
    of a compressor's encode queue without a stall, and its values are read once, with the selection's.

    The stages are those of :func:`multistage_threshold` (SIDCo (Abdelmoniem et al.), Sec. 2.4, Lemma 2 (7)-(9),
    Cor. 2.1 (10)-(11)) and the same float64 operations on 0-d tensors, so the threshold is the one
    ``multistage_threshold(x, ..., method="closed_form", final_count=False, details=False)`` computes with 0-d
    tensors (a device, or a CPU under the ``never`` kernel policy), bit for bit, and the one it computes with host
    numbers (a CPU otherwise) within the last bits of a logarithm. Only stage 1 differs in where its facts come
    from: the count of non-zeros, the largest magnitude (the power-of-two unit) and the conditional ratio
    delta_1 d / n stay 0-d tensors (:func:`gradstat.theory.estimators.magnitudes.device_facts`).

    The common case only: where this form would not equal the synchronous one, :attr:`DeferredPot.settle` says
    ``exact_path``: data that :func:`gradstat.theory.estimators.magnitudes.check_magnitudes` rejects (NaN or inf,
    negative magnitudes, all zeros; with a shaped first law one non-zero or constant non-zeros), fewer non-zeros
    than stage 1 needs (delta_1 d / n >= 1, where the synchronous form keeps them all and re-splits the later
    ratios), and, where the statistics come from plain reductions rather than the fused kernel (magnitudes, not
    ``signed``, without a C loop or compiled kernel), a largest magnitude outside the range in which those
    reductions run on the values directly (:func:`gradstat.theory.estimators.exceedances.direct_ok`: float32
    magnitudes between about 2e-10 and 9e9), or, for a gamma first stage, a smallest non-zero whose ratio to it
    underflows x's dtype.

    Parameters
    ----------
    x : Tensor
        Magnitudes |g| (or signed g with ``signed``), any shape, on any device.
    ratio, stages, first, first_ratio, anchor, quantile, signed : as for :func:`multistage_threshold`.
    stats : Tensor, optional
        The caller's :func:`gradstat.theory.kernels.stage_stats.summary` of ``x`` (same ``signed``; with its minima
        for a shaped first law, its sum of squares for the generalized Pareto), as :func:`multistage_threshold`
        takes it; None computes it (or its plain reductions) here.

    Raises
    ------
    ValueError, TypeError
        What is wrong with the arguments, as :func:`multistage_threshold` raises it, where that is known without
        reading ``x`` (ratios, stages, laws, an empty ``x`` or one shorter than 1 / ratio).
    """
    plan = _plan(ratio, stages, first, None, first_ratio, None, anchor, "closed_form", quantile)
    check_length(nonempty(x, "x").numel(), plan.ratio)  # (what is known without reading x, raised here)
    values = DEFERRED_STAGES(x, stats, ratio, stages, first, first_ratio, anchor, quantile, signed)
    count = len(plan.deltas)

    def settle(read: list[float]) -> tuple[bool, str | None]:
        if read[0]:
            return True, None
        return False, _stop_reason(read[1 : 1 + 2 * count : 2], read[2 : 2 + 2 * count : 2])

    return DeferredPot(threshold=values[0], reads=values[1:], settle=settle)


def _deferred_stages(
    x: torch.Tensor,
    stats: torch.Tensor | None,
    ratio: float,
    stages: int,
    first: str,
    first_ratio: float,
    anchor: str,
    quantile: str,
    signed: bool,
) -> torch.Tensor:
    """The work of :func:`deferred_threshold` on x's device: ``[eta_M, rare flag, then each stage's count and
    validity]`` (float64), one tensor so that the whole runs as one compiled function
    (:data:`DEFERRED_STAGES`). Its stages always number ``stages``: the only branch that re-splits them (fewer
    non-zeros than stage 1 needs) is flagged rare."""
    plan = _plan(ratio, stages, first, None, first_ratio, None, anchor, "closed_form", quantile)
    facts = device_facts(x, "x", **_first_stage_reads(first, signed, stats))
    check_length(facts.d, plan.ratio)
    values = facts.values
    unit = device_unit(facts.max)
    first_data = Exceedances(
        values,
        n_hint=facts.n_nonzero,
        unit=unit,
        signed=signed,
        preset=facts.first_moments(unit),
        squares=first == "genpareto",
        host=False,
    )
    est = plan.run_first(first_data)
    tail = conditional_ratio(plan.deltas[0], facts.d, facts.n_nonzero)
    rare = facts.rare | ~(tail < 1.0)  # (n = 0 gives tail = inf)
    if not (signed or tail_moments.fast_for(values, None, None, None, first == "gamma")):
        rare = rare | ~direct_ok(unit, values.dtype)  # (the plain reductions, which read the unit on the host)
        if first == "gamma" and facts.min_nonzero is not None:  # (read: a shaped law)
            # log z underflows: the synchronous form takes its logarithms in float64
            rare = rare | (facts.min_nonzero / unit < torch.finfo(values.dtype).tiny)
    eta, ok = _first_threshold(first, est, tail, quantile, plan.deltas[0], validated=True)
    done = [_Stage(plan.deltas[0], eta, est, facts.n_nonzero, ok, 0, "closed_form", first)]
    fused_stages, _, values = _later_stages(values, done, plan.deltas, plan, anchor, unit, signed, False, None)
    # a stage that fails keeps its predecessor's threshold and fails every later one (``ok`` is chained), so the last
    # stage holds the last completed one's threshold (0 when stage 1 failed): the synchronous form's result
    reads = [done[-1].threshold, rare, *_to_read(values, done, fused_stages, False, False)]
    return torch.stack([S.as_tensor(t, values.device).to(torch.float64) for t in reads])


DEFERRED_STAGES = Fused(_deferred_stages)
""":func:`deferred_threshold`'s work as one fused function: on a device where kernels compile
(:mod:`gradstat.theory.kernels.policy`: CUDA with Triton, from ``MIN_ELEMENTS`` elements under ``auto``) its
statistics' passes and the stages' hundreds of scalar operations on 0-d tensors become a few generated kernels
instead of a launch each; elsewhere, and as the reference, the same function eagerly."""


def _multistage(
    abs_g: object,
    ratio: float,
    stages: int,
    first: str,
    later: str | None,
    first_ratio: float,
    ratios: list[float] | None,
    anchor: str,
    method: str,
    quantile: str,
    signed: bool,
    final_count: bool,
    stats: torch.Tensor | None,
    narrow: Callable[[torch.Tensor, torch.Tensor | float], tuple[torch.Tensor, torch.Tensor]] | None,
    details: bool,
) -> PotResult:
    plan = _plan(ratio, stages, first, later, first_ratio, ratios, anchor, method, quantile)
    deltas = plan.deltas
    mags = check_magnitudes(abs_g, "abs_g", **_first_stage_reads(first, signed, stats))
    check_length(mags.d, plan.ratio)
    x = mags.values
    host = S.on_host(x)
    unit = unit_for(mags.max)  # statistics normalised by a power of two near max |g| (scale-free arithmetic)

    # stage 1: fit the non-zeros, threshold at the conditional ratio
    first_data = Exceedances(
        x,
        n_hint=mags.n_nonzero,
        unit=unit,
        bottom=mags.min_nonzero,
        signed=signed,
        preset=mags.first_moments(unit, host),
        squares=first == "genpareto",  # the exponential fit reads the mean, the gamma fit the mean and mean log
        host=host,
    )
    est = plan.run_first(first_data)
    tail = conditional_ratio(deltas[0], mags.d, mags.n_nonzero)
    count = S.constant(float(mags.n_nonzero), x, host)
    if tail >= 1.0:
        # stage 1 keeps every non-zero, i.e. the ratio n/d instead of delta_1: the later stages share what is left
        achieved = mags.n_nonzero / mags.d
        note = (
            f"stage 1 ratio {deltas[0]} needs more elements than the {mags.n_nonzero} non-zeros: threshold 0 "
            f"(ratio {achieved:.4g})"
        )
        if len(deltas) > 1 and plan.ratio < achieved:
            rest = (plan.ratio / achieved) ** (1.0 / (len(deltas) - 1))
            deltas = [achieved] + [rest] * (len(deltas) - 1)
            note += f"; later stages re-split to {rest:.4g} each"
        else:
            deltas = [achieved]  # the target itself needs every non-zero element
        eta, ok = S.constant(0.0, x, host), S.flag(True, x, host)
        done = [_Stage(deltas[0], eta, est, count, ok, mags.n_zeros, method, first, note)]
    else:
        eta, ok = _first_threshold(first, est, tail, quantile, deltas[0])
        done = [_Stage(deltas[0], eta, est, count, ok, mags.n_zeros, method, first)]
    fused_stages, candidates, x = _later_stages(x, done, deltas, plan, anchor, unit, signed, host, narrow)
    result = _assemble(done, S.read(_to_read(x, done, fused_stages, final_count, host)), final_count, details, x.device)
    if candidates is not None:
        result.candidates, result.candidate_magnitudes = candidates, x
    return result


@dataclass
class _Plan:
    """The validated arguments of a multi-stage fit: the target ratio, the stages' ratios and laws and their
    estimators."""

    ratio: float
    deltas: list[float]
    later: str
    later_method: str
    run_first: Estimator
    run_later: Estimator


def _plan(
    ratio: float,
    stages: int,
    first: str,
    later: str | None,
    first_ratio: float,
    ratios: list[float] | None,
    anchor: str,
    method: str,
    quantile: str,
) -> _Plan:
    ratio = check_ratio(ratio)
    _choice(first, FIRST, "first")
    later = PAPER_LATER[first] if later is None else _choice(later, LATER, "later")
    _choice(anchor, ANCHORS, "anchor")
    _choice(quantile, QUANTILES, "quantile")
    run_first = estimator(first, method)
    later_method = _later_method(method)
    run_later = estimator(later, later_method)
    deltas = stage_ratios(ratio, stages, first_ratio) if ratios is None else _check_ratios(ratios, ratio, stages)
    return _Plan(ratio, deltas, later, later_method, run_first, run_later)


def _first_threshold(
    first: str, est: Estimate, tail: float | torch.Tensor, quantile: str, ratio: float, validated: bool = False
) -> tuple[S.Scalar, S.Flag]:
    """Stage 1's threshold eta_1 at the conditional ratio ``tail`` (< 1; at least stage 1's ``ratio``, as
    delta_1 d / n with n <= d) and its validity: 0 where the fit or its quantile is not finite."""
    eta = tail_quantile(first, est.params, tail, quantile, validated=validated, tail_at_least=ratio)
    ok = est.valid() & S.isfinite(eta)
    return S.where(ok, eta, 0.0), ok


def _later_stages(
    x: torch.Tensor,
    done: list[_Stage],
    deltas: list[float],
    plan: _Plan,
    anchor: str,
    unit: float | torch.Tensor,
    signed: bool,
    host: bool,
    narrow: Callable[[torch.Tensor, torch.Tensor | float], tuple[torch.Tensor, torch.Tensor]] | None,
) -> tuple[bool, torch.Tensor | None, torch.Tensor]:
    """Stages 2..M after the first (appended to ``done``): each fits the exceedances of the previous threshold,
    shifted by the anchor, and keeps the previous threshold where it is degenerate. Without the MLE and ``narrow``,
    nothing is read back (0-d tensors stay on x's device). Returns whether the stages' statistics came from the
    fused kernel, the candidates gathered by ``narrow`` (or None) and the vector the last stage read."""
    later, later_method = plan.later, plan.later_method
    # shifted exceedances, reused by every stage (the fused kernel needs none)
    fused_stages = signed or tail_moments.fast_for(x, None, None, None, False)
    workspace = torch.empty_like(x) if len(deltas) > 1 and not fused_stages else None
    candidates = None
    for m, delta in enumerate(deltas[1:], start=2):
        prev = done[-1].threshold
        if narrow is not None and m == len(deltas) and math.prod(deltas[:-1]) <= NARROW_FRACTION:
            rounded = S.in_dtype(prev, x.dtype)  # (a host float where the scalars are on the host)
            candidates, x = narrow(x, float(rounded) if host else rounded.to(x.dtype))  # the magnitudes, unsigned
            workspace, signed = None, False
        if anchor == "threshold":
            shift = prev
        else:
            a = x.abs() if signed else x
            smallest = torch.where(a > S.as_tensor(prev, x.device).to(x.dtype), a, math.inf).amin().to(torch.float64)
            shift = S.host_values([smallest])[0] if host else smallest
        squares = later != "exponential"  # the exponential fit reads the mean only
        data = Exceedances(
            x, above=prev, shift=shift, workspace=workspace, unit=unit, signed=signed, squares=squares, host=host
        )
        count = data.count()
        if later_method == "mle" and int(count) < 2:  # the MLE compacts: stop before it sees < 2 values
            done.append(
                _Stage(
                    delta,
                    prev,
                    Estimate(params={}),
                    count,
                    S.flag(False, x, host),
                    0,
                    later_method,
                    later,
                )
            )
            break
        est = plan.run_later(data)
        candidate = shift + tail_quantile(later, est.params, delta) if delta < 1.0 else shift + 0.0
        ok = done[-1].ok & (count >= 2) & est.valid() & S.isfinite(candidate)
        eta = S.where(ok, candidate, prev)
        done.append(_Stage(delta, eta, est, count, ok, 0, later_method, later))
    return fused_stages, candidates, x


def _to_read(
    x: torch.Tensor, done: list[_Stage], fused_stages: bool, final_count: bool, host: bool
) -> list[S.Scalar | S.Flag]:
    """What the result is assembled from (:func:`_assemble`), in its order: each stage's count and validity, then
    (with ``final_count``) the count of the survivors of the final threshold (one more pass)."""
    values: list[S.Scalar | S.Flag] = [v for s in done for v in (s.count, s.ok)]
    if final_count:
        last = S.as_tensor(done[-1].threshold, x.device)
        if fused_stages:  # the count of one fused pass over |x| (its sums are not used)
            zero = torch.zeros((), dtype=torch.float64, device=x.device)
            values.append(tail_moments(x, last.to(x.dtype).double(), zero, zero + 1, False)[0])
        else:
            values.append(torch.count_nonzero(x > last.to(x.dtype)).double())
    return values


def _assemble(
    done: list[_Stage], values: list[float], final_count: bool, details: bool, device: torch.device
) -> PotResult:
    """The result from the values of :func:`_to_read` as read back: the final threshold, why the stages stopped
    early, and (with ``details``) each completed stage's fit, threshold and survivors."""
    counts, oks = values[0 : 2 * len(done) : 2], values[1 : 2 * len(done) : 2]
    survivors = counts[1:] + (values[-1:] if final_count else [-1.0])

    stages: list[StageResult] = []
    reason = _stop_reason(counts, oks)
    completed = 0
    for m, (s, n, ok) in enumerate(zip(done, counts, oks, strict=True), start=1):
        if not ok:
            break
        completed = m
        if not details:
            continue
        fit = resolve(s.estimate, s.dist, s.method, int(n), s.n_zeros, device)
        if s.note:
            fit.warnings.append(s.note)
        stages.append(
            StageResult(
                ratio=s.ratio,
                threshold=S.as_tensor(s.threshold, device),
                fit=fit,
                survivors=None if m == len(done) and not final_count else _count(survivors[m - 1], device),
            )
        )
    if not completed:
        final = torch.zeros((), dtype=torch.float64, device=device)
    else:
        final = stages[-1].threshold if stages else S.as_tensor(done[completed - 1].threshold, device)
    return PotResult(threshold=final, stages=stages, stopped_reason=reason)


def _first_stage_reads(first: str, signed: bool, stats: torch.Tensor | None) -> dict[str, Any]:
    """What stage 1 of the law ``first`` checks and reads in the validation pass, as both forms ask it of
    :func:`~gradstat.theory.estimators.magnitudes.check_magnitudes` and ``device_facts``: the spread of a shaped law,
    the sum of squares for the generalized Pareto's variance, the sum of logarithms for the gamma."""
    return {
        "spread": first in SHAPED,
        "signed": signed,
        "stats": stats,
        "squares": first == "genpareto",
        "logs": first == "gamma",
    }


def _stop_reason(counts: list[float], oks: list[float]) -> str | None:
    """Why the stages stopped early, from each stage's survivor count and validity as read back (None: every stage
    completed): the first stage that failed, and what it had to fit."""
    for m, (n, ok) in enumerate(zip(counts, oks, strict=True), start=1):
        if ok:
            continue
        if m == 1:
            return "stage 1: degenerate fit (non-finite parameters); threshold 0"
        n = int(n)
        why = (
            "no survivor"
            if n == 0
            else "one survivor"
            if n == 1
            else "degenerate fit (zero variance or non-finite parameters)"
        )
        return f"stage {m}: {why} above the stage-{m - 1} threshold; kept the previous threshold"
    return None


def _count(value: float, device: torch.device) -> torch.Tensor:
    """A survivor count read back as a float, as a 0-d int64 tensor."""
    return torch.scalar_tensor(round(value), dtype=torch.int64, device=device)
