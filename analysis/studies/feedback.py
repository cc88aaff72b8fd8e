"""Weighted error feedback: the residual ``E||r_t||^2 / B`` against the bound eta(beta) of QCS Lemma 4.

Source: QCS (Abdi & Fekri, Quantized Compressive Sampling), eq. (14a-d) (the feedback,
``compressors.ErrorFeedback.qcs(beta)``), Lemma 4 (15)/(16), Remark 2 (17)/(18) and Remark 3 (Karimireddy et al.'s
eta_k). ``B`` is the largest ``||g_t||^2`` of the
replayed sequence (so ``E||g||^2 <= B`` holds), the expectation is over seeds (independent replays).

Which eta applies: MMSE-QCS (bound key ``qcs_mmse``) gets (16) with its gamma; any other unbiased compressor with
a closed-form variance factor gamma (``analysis.studies.bounds``; QCS's (10), QSGD's, DQSG's, ...) gets (15), whose
proof uses only unbiasedness and ``E||e||^2 <= gamma ||z||^2``. Anything else has no bound here.

How long to replay: the residual obeys ``r_{t+1} = (1 - beta) r_t + e_t`` from ``r_0 = 0``, so its second moment
approaches its stationary level like ``1 - (1 - beta)^t``; a maximum over fewer steps than that checks the bound
before the residual can reach it. :func:`settle_steps` gives the number of steps after which the transient
``(1 - beta)^T`` is below ``1e-4`` (42 steps at beta = 0.2, 88 at beta = 0.1), at least 20.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from gradstat import compressors
from gradstat.analysis.measure.intervals import DEFAULT_LEVEL, mean_ci
from gradstat.analysis.measure.sources import GradientSource
from gradstat.analysis.measure.tables import write_table
from gradstat.analysis.measure.verdicts import verdict
from gradstat.analysis.studies.bounds import closed_form_bound, qcs_gamma
from gradstat.compressors import Compressor, Context, ErrorFeedback
from gradstat.compressors.memory.feedback import FeedbackState
from gradstat.compressors.memory.send import feedback_round, new_worker_states


@dataclass(frozen=True)
class FeedbackTheory:
    """gamma of the compressor and which residual bound applies (``unbiased`` (15), ``mmse`` (16) or None)."""

    gamma: float | None
    kind: str | None

    def eta(self, beta: float) -> tuple[float, str]:
        """eta(beta) (inf and a reason when the formula gives no bound)."""
        from gradstat.theory.qcs import residual_bound_mmse, residual_bound_unbiased

        if self.kind is None or self.gamma is None:
            return math.inf, "no residual bound applies to this compressor"
        b = (residual_bound_mmse if self.kind == "mmse" else residual_bound_unbiased)(self.gamma, beta)
        return b.value, b.reason

    def eta_minkowski(self, beta: float) -> float:
        """For MMSE-QCS, the bound derived from Lemma 3 by Minkowski's inequality (valid for every beta in
        (0, 1]; see :func:`gradstat.theory.qcs.residual_bound_mmse_minkowski`); nan for other compressors."""
        from gradstat.theory.qcs import residual_bound_mmse_minkowski

        if self.kind != "mmse" or self.gamma is None:
            return math.nan
        return residual_bound_mmse_minkowski(self.gamma, beta).value

    def optimum(self) -> tuple[float, float]:
        """(beta*, eta*) of (17) for unbiased or (18) for MMSE."""
        from gradstat.theory.qcs import optimal_feedback_mmse, optimal_feedback_unbiased

        if self.kind is None or self.gamma is None:
            return math.nan, math.nan
        return (optimal_feedback_mmse if self.kind == "mmse" else optimal_feedback_unbiased)(self.gamma)


def residual_of(state: FeedbackState) -> torch.Tensor:
    """A worker's residual after at least one feedback round (it is None only before the first)."""
    if state.residual is None:
        raise ValueError("no residual yet: run a feedback round first")
    return state.residual


def feedback_theory(comp: Compressor, g: torch.Tensor) -> FeedbackTheory:
    """The gamma and bound kind of ``comp`` on gradients like ``g`` (see the module docstring)."""
    if comp.properties.bound == "qcs_mmse":
        return FeedbackTheory(qcs_gamma(comp), "mmse")
    b = closed_form_bound(comp, g)
    if comp.properties.unbiased and b.value is not None and b.claim in ("upper", "equal"):
        return FeedbackTheory(b.value, "unbiased")
    return FeedbackTheory(None, None)


SETTLE_TOLERANCE = 1e-4
"""Transient (1 - beta)^T left when a replay stops (see the module docstring)."""


def settle_steps(beta: float, tolerance: float = SETTLE_TOLERANCE, minimum: int = 20) -> int:
    """Steps T with ``(1 - beta)^T <= tolerance`` (at least ``minimum``): long enough for the residual of weighted
    feedback (14d) to settle. beta must lie in (0, 1]."""
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"feedback weight beta must lie in (0, 1], got {beta}")
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"tolerance must lie in (0, 1), got {tolerance}")
    if beta == 1.0:
        return minimum
    return max(minimum, math.ceil(math.log(tolerance) / math.log(1.0 - beta)))


def cycled(sequence: Sequence, length: int) -> list:
    """``sequence`` repeated up to ``length`` items (a dump has fewer recorded steps than a replay needs)."""
    return [sequence[t % len(sequence)] for t in range(length)]


def residual_samples(
    comp: Compressor, beta: float, sequence: Sequence[Sequence[torch.Tensor]], seeds: Sequence[int]
) -> np.ndarray:
    """``||r_{t+1}||^2`` per seed and step, averaged over workers: array of shape (len(seeds), T).

    ``sequence[t][w]`` is worker w's gradient at step t; each seed replays the whole sequence from r_0 = 0.
    """
    fb = ErrorFeedback.qcs(beta)
    out = np.zeros((len(seeds), len(sequence)))
    for i, seed in enumerate(seeds):
        states = new_worker_states(comp, len(sequence[0]))
        for t, grads in enumerate(sequence):
            feedback_round(comp, fb, grads, states, Context(seed=int(seed), step=t))
            out[i, t] = np.mean([float(residual_of(s.feedback).double().square().sum()) for s in states])
    return out


def feedback_table(
    spec: str,
    betas: Sequence[float],
    sequence: Sequence[Sequence[torch.Tensor]],
    seeds: Sequence[int],
    level: float = DEFAULT_LEVEL,
    progress: bool = False,
    settle: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """eta vs beta for compressor ``spec`` over a gradient sequence; with ``settle``, each beta replays the
    sequence cycled to at least :func:`settle_steps` steps (column ``steps``).

    Returns
    -------
    (summary, per_step) : ``summary`` has one row per beta: ``beta, empirical`` (max over t of the seed-mean of
    ``||r_t||^2 / B``), ``ci_low, ci_high`` (interval of that mean at the maximising step), ``mean_over_steps``,
    ``eta`` (inf when no bound), ``eta_reason``, ``eta_minkowski`` (MMSE only), ``verdict``, ``gamma``, ``bound_kind``,
    ``beta_star``,
    ``eta_star``, ``eta_karimireddy``, ``B``; ``per_step`` has ``beta, step, residual_rel_mean`` per step.
    """
    from gradstat.theory.qcs import karimireddy_residual_bound

    if not sequence or not sequence[0]:
        raise ValueError("feedback study needs at least one step and one worker")
    if len(seeds) < 2:
        raise ValueError(f"feedback study needs >= 2 seeds for a confidence interval, got {len(seeds)}")
    comp = compressors.create(spec)
    B = max(float(g.double().square().sum()) for grads in sequence for g in grads)
    if B == 0.0:
        raise ValueError("every gradient of the sequence is zero: B = 0")
    th = feedback_theory(comp, sequence[0][0])
    beta_star, eta_star = th.optimum()
    eta_k = karimireddy_residual_bound(th.gamma) if th.kind == "mmse" and th.gamma is not None else math.nan
    rows: list[dict] = []
    steps: list[dict] = []
    for beta in tqdm(betas, desc="feedback", disable=not progress, leave=False):
        seq = cycled(sequence, max(len(sequence), settle_steps(beta))) if settle else sequence
        r = residual_samples(comp, beta, seq, seeds) / B
        means = r.mean(axis=0)
        t_max = int(np.argmax(means))
        est = mean_ci(r[:, t_max], level)
        eta, reason = th.eta(beta)
        rows.append(
            {
                "beta": beta,
                "empirical": est.mean,
                "ci_low": est.low,
                "ci_high": est.high,
                "level": level,
                "mean_over_steps": float(means.mean()),
                "eta": eta,
                "eta_reason": reason,
                "eta_minkowski": th.eta_minkowski(beta),
                "verdict": verdict("upper", eta if math.isfinite(eta) else None, est),
                "gamma": th.gamma,
                "bound_kind": th.kind,
                "beta_star": beta_star,
                "eta_star": eta_star,
                "eta_karimireddy": eta_k,
                "B": B,
                "seeds": len(seeds),
                "steps": len(seq),
                "distinct_blocks": len(sequence),
            }
        )
        steps.extend({"beta": beta, "step": t, "residual_rel_mean": float(m)} for t, m in enumerate(means))
    return pd.DataFrame(rows), pd.DataFrame(steps)


def eta_curve(summary: pd.DataFrame, points: int = 200) -> pd.DataFrame:
    """The bounds of ``summary``'s compressor over ``beta`` in (0, 1], each only where it is valid.

    Columns ``beta, bound, value``: ``eta`` ((15) or (16) as printed; rows only where the formula gives a bound),
    ``eta_minkowski`` (MMSE only, every beta in (0, 1]) and ``karimireddy`` (Remark 3's eta_k, MMSE only, at
    beta = 1 only: it is stated for feedback weight 1).
    """
    first = summary.iloc[0]
    th = FeedbackTheory(
        None if pd.isna(first["gamma"]) else float(first["gamma"]),
        None if pd.isna(first["bound_kind"]) else str(first["bound_kind"]),
    )
    grid = np.linspace(0.01, 1.0, points)
    rows = [{"beta": b, "bound": "eta", "value": v} for b in grid if math.isfinite(v := th.eta(b)[0])]
    if th.kind == "mmse":
        rows += [{"beta": b, "bound": "eta_minkowski", "value": th.eta_minkowski(b)} for b in grid]
        if math.isfinite(first["eta_karimireddy"]):
            rows.append({"beta": 1.0, "bound": "karimireddy", "value": float(first["eta_karimireddy"])})
    return pd.DataFrame(rows, columns=["beta", "bound", "value"])


def run(
    source: GradientSource,
    workers: Sequence[int],
    out: Path,
    spec: str,
    betas: Sequence[float],
    n: int,
    steps: int,
    seeds: int,
    device: torch.device,
    progress: bool = True,
    stem: str = "feedback",
    settle: bool = False,
) -> pd.DataFrame:
    """eta vs beta (``analysis.studies.feedback``) on ``steps`` consecutive gradient blocks of length ``n`` (cycled
    to :func:`settle_steps` per beta with ``settle``); files ``<stem>.csv``, ``<stem>_steps.csv``,
    ``<stem>_eta_vs_beta.png``."""
    from gradstat.analysis.plots.feedback import eta_vs_beta

    sequence = []
    for t in range(steps):
        sequence.append(
            [GradientSource(source.dump, source.steps, w, source.seed).vector(n, device, index=t) for w in workers]
            if source.dump is not None
            else [source.vector(n, device, index=t)]
        )
    summary, per_step = feedback_table(spec, betas, sequence, list(range(seeds)), progress=progress, settle=settle)
    summary["n"] = n
    summary["workers"] = len(workers) if source.dump is not None else 1
    write_table(summary, out, stem)
    write_table(per_step, out, f"{stem}_steps")
    eta_vs_beta(summary, eta_curve(summary), out, f"{stem}_eta_vs_beta")
    return summary
