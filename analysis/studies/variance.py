"""Monte Carlo relative error ``E||C(g) - g||^2 / ||g||^2`` of a compressor on fixed vectors, with a confidence
interval, next to the compressor's closed-form bound and a verdict.

The expectation is over the compressor's randomness only (the bounds are conditional on g): trial ``t`` encodes
``g`` with ``Context(seed, step=t)``, so trials are independent and reproducible. The closed form that applies is
named by the compressor's ``properties.bound`` and computed by :mod:`gradstat.analysis.studies.bounds` (one home
for that mapping).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from gradstat import compressors
from gradstat.analysis.measure.intervals import DEFAULT_LEVEL, mean_ci
from gradstat.analysis.measure.tables import write_table
from gradstat.analysis.measure.verdicts import verdict
from gradstat.analysis.studies.bounds import closed_form_bound
from gradstat.compressors import Compressor, Context


def _decoded(comp: Compressor, g: torch.Tensor, seed: int, trial: int) -> torch.Tensor:
    ctx = Context(seed=seed, step=trial)
    return comp.decode(comp.encode(g, ctx), ctx)


def error_samples(comp: Compressor, g: torch.Tensor, trials: int, seed: int = 0) -> np.ndarray:
    """``||C(g) - g||^2 / ||g||^2`` for ``trials`` independent seeds (float64 arithmetic).

    Raises
    ------
    ValueError : ``g`` is all zeros (the ratio is undefined) or ``trials < 2``.
    """
    if trials < 2:
        raise ValueError(f"trials must be >= 2 for a confidence interval, got {trials}")
    gg = float(g.double().square().sum())
    if gg == 0.0:
        raise ValueError("the gradient vector is all zeros: the relative error is undefined")
    return np.array(
        [float((_decoded(comp, g, seed, t).double() - g.double()).square().sum()) / gg for t in range(trials)]
    )


def bias_samples(
    comp: Compressor, g: torch.Tensor, trials: int, seed: int = 0, direction: torch.Tensor | None = None
) -> np.ndarray:
    """Projected bias ``<C(g) - g, v> / <g, v>`` per trial, ``v = direction`` (default ``g``).

    Its mean is 0 for an unbiased compressor, ``alpha - 1`` for one that scales an unbiased estimate by alpha.
    """
    v = (g if direction is None else direction).double()
    denom = float((g.double() * v).sum())
    if denom == 0.0:
        raise ValueError("the projection direction is orthogonal to g: the projected bias is undefined")
    return np.array(
        [float(((_decoded(comp, g, seed, t).double() - g.double()) * v).sum()) / denom for t in range(trials)]
    )


def variance_table(
    specs: Sequence[str],
    vectors: Sequence[tuple[str, torch.Tensor]],
    trials: int,
    seed: int = 0,
    level: float = DEFAULT_LEVEL,
    progress: bool = False,
) -> pd.DataFrame:
    """Monte Carlo relative error vs closed-form bound for every (compressor spec, vector).

    Parameters
    ----------
    specs : compressor spec strings (``compressors.create``).
    vectors : ``(label, g)`` pairs, ``g`` a 1-D float tensor on the device to run on.
    trials : Monte Carlo trials per cell (>= 2).
    level : two-sided confidence level of the interval.

    Returns
    -------
    DataFrame, one row per pair: ``compressor, vector, d, empirical, ci_low, ci_high, level, trials, bound,
    bound_name, theory_over_empirical, verdict`` (verdict of ``empirical <= bound``; equality bounds such as DQSG's
    exact variance are compared as equalities).
    """
    rows = []
    bar = tqdm(total=len(specs) * len(vectors), desc="variance", disable=not progress, leave=False)
    for spec in specs:
        comp = compressors.create(spec)
        for label, g in vectors:
            est = mean_ci(error_samples(comp, g, trials, seed), level)
            b = closed_form_bound(comp, g)
            rows.append(
                {
                    "compressor": spec,
                    "vector": label,
                    "d": g.numel(),
                    "empirical": est.mean,
                    "ci_low": est.low,
                    "ci_high": est.high,
                    "level": level,
                    "trials": trials,
                    "bound": np.nan if b.value is None else b.value,
                    "bound_name": b.name,
                    "theory_over_empirical": np.nan if b.value is None or est.mean == 0 else b.value / est.mean,
                    "verdict": verdict(b.claim, b.value, est),
                }
            )
            bar.update(1)
    bar.close()
    return pd.DataFrame(rows)


def run(
    vectors: Sequence[tuple[str, torch.Tensor]],
    specs: Sequence[str],
    out: Path,
    trials: int,
    seed: int = 0,
    progress: bool = True,
) -> pd.DataFrame:
    """Monte Carlo relative error vs closed-form bound (``analysis.studies.variance``)."""
    df = variance_table(specs, vectors, trials, seed, progress=progress)
    write_table(df, out, "variance")
    return df
