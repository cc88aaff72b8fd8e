"""The verdict rules every experiment applies, written once.

1. **A claim about a distribution of steps is judged per step**: the share of steps that meet it (within its
   tolerance), with the share's Clopper-Pearson interval, against the share the claim needs
   (:func:`per_step_share`, compared by a ``share`` :class:`~gradstat.analysis.experiments.base.Comparison`); never
   on a mean, which a few wild steps or a cancellation can bring to the target.
2. **A paper value is compared only where the paper states it** (workload, setting): :func:`stated_for` says
   whether a row exists at all; elsewhere the row is absent, not "not comparable".
3. **A method that fails to converge is counted the same way for every method**: its time is the run's length
   plus one step, a lower bound (:func:`steps_or_never`); a ratio of two such times is a bound whose direction
   the row says, and it is undefined only when neither converged (:func:`time_ratio`).
4. **A sufficient condition is shown as such**: "mu < 1/lambda_max converges" says every step below the limit
   converges, not that the largest converging step is the limit (:func:`sufficient_condition_holds`).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np

from gradstat.analysis.measure.intervals import Estimate, proportion_ci

LEVEL = 0.99
"""Confidence level of a share's interval."""


def per_step_share(values: Sequence[float] | np.ndarray, meets: Callable[[np.ndarray], np.ndarray]) -> Estimate:
    """The share of steps whose value ``meets`` the claim, with its Clopper-Pearson interval at :data:`LEVEL`.

    Parameters
    ----------
    values : one value per step (NaN counts as not meeting the claim).
    meets : elementwise predicate on the values (e.g. ``lambda q: abs(q - 1) <= 0.2``).

    Raises
    ------
    ValueError : no steps.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        raise ValueError("a per-step claim needs at least one step, got none")
    ok = np.asarray(meets(v), dtype=bool) & np.isfinite(v)
    return proportion_ci(int(ok.sum()), int(v.size), LEVEL)


def stated_for(setting: str, stated: Iterable[str]) -> bool:
    """Whether the paper states its value for ``setting`` (a workload or a setting name): only then is the paper
    value compared."""
    return setting in set(stated)


def steps_or_never(steps: float, run_length: int) -> tuple[float, bool]:
    """A run's steps to a target, or ``run_length + 1`` (a lower bound) when it never got there; with whether it
    converged. The same rule for every method."""
    if run_length < 0:
        raise ValueError(f"run_length must be >= 0, got {run_length}")
    if math.isfinite(steps):
        return float(steps), True
    return float(run_length + 1), False


def time_ratio(numerator: float, denominator: float, run_length: int) -> tuple[float, str]:
    """``numerator / denominator`` of two steps-to-target, each counted by :func:`steps_or_never`; with what the
    value is: ``exact``, ``lower bound`` (only the numerator never converged), ``upper bound`` (only the
    denominator), or NaN and ``neither converged``."""
    num, num_ok = steps_or_never(numerator, run_length)
    den, den_ok = steps_or_never(denominator, run_length)
    if not (num_ok or den_ok):
        return math.nan, "neither converged"
    return num / den, "exact" if num_ok and den_ok else "lower bound" if den_ok else "upper bound"


def sufficient_condition_holds(tested: Sequence[float], converged: Sequence[bool], limit: float) -> float:
    """1.0 when every tested value below ``limit`` converged (what a sufficient condition "x < limit converges"
    claims), 0.0 when one did not, NaN when none was tested below it. Values at or above the limit say nothing
    about the condition."""
    below = [ok for x, ok in zip(tested, converged, strict=True) if x < limit]
    if not below:
        return math.nan
    return 1.0 if all(below) else 0.0
