"""Time and accuracy of every estimator of theory.estimators next to scipy.stats' fit of the same model.

Data: |g| ~ gamma(``shape``, ``scale``) (the issue asks for gamma(0.6)), ``sizes`` elements each, drawn once per size
with numpy and given to the estimators as a ``dtype`` tensor on ``device``; scipy fits the float64 copy of the very
same values. Baselines measured in the same run: ``scipy.stats.gamma.fit(floc=0)``, ``genpareto.fit(floc=0)``,
``expon.fit(floc=0)``. The relative errors compare each estimator with scipy's MLE of the same model on the same
data (so a closed form's error is its distance from the MLE, not from the truth).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from scipy import stats

from gradstat.analysis.bench.timing import bench_device, median_ms, progress, time_ms
from gradstat.theory.estimators import fit
from gradstat.theory.estimators.registry import ESTIMATORS

OPTIONS = """
sizes : list[int] -- numbers of |g| values (default 100000,1000000,10000000).
shape : float -- gamma shape of the synthetic |g| (default 0.6).
scale : float -- gamma scale (default 1e-3).
repeats : int -- timed repetitions of each torch estimator; median reported (default 3, after one warm-up).
scipy_repeats : int -- timed repetitions of each scipy fit (default 1; the generalized Pareto fit is slow).
device : str -- 'cpu' or 'cuda' (default 'cpu').
dtype : str -- 'float32' or 'float64' for the torch estimators (default 'float32', the usual gradient dtype).
seed : int -- seed of the data (default 0).
threads : int -- torch CPU threads during the run (default 0: leave torch's setting; 1 compares like with like
    against single-threaded scipy and avoids OpenMP stalls on a busy machine).
"""

SCIPY_MODELS = {"exponential": stats.expon, "gamma": stats.gamma, "genpareto": stats.genpareto}


def _scipy_fit(dist: str, x: np.ndarray) -> dict[str, float]:
    """scipy's MLE with the location fixed at 0, as a params dict in our naming."""
    est = SCIPY_MODELS[dist].fit(x, floc=0)
    return {"scale": float(est[-1])} if dist == "exponential" else {"shape": float(est[0]), "scale": float(est[-1])}


def _loglik(dist: str, params: dict[str, float], x: np.ndarray) -> float:
    shape = () if dist == "exponential" else (params["shape"],)
    return float(np.sum(SCIPY_MODELS[dist].logpdf(x, *shape, scale=params["scale"])))


def run(
    sizes: Sequence[int] = (100_000, 1_000_000, 10_000_000),
    shape: float = 0.6,
    scale: float = 1e-3,
    repeats: int = 3,
    scipy_repeats: int = 1,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    threads: int = 0,
) -> pd.DataFrame:
    """Benchmark table: one row per (size, dist, method).

    Columns: ``size``, ``dist``, ``method``, ``ms`` (median wall time of ``fit``, validation included),
    ``ms_min``/``ms_max`` (spread of the timed calls, after two warm-up calls), ``scipy_ms`` (scipy's fit of
    the same model on the same values), ``speedup`` (scipy_ms / ms),
    ``shape``/``scale`` (our estimates), ``shape_rel_err``/``scale_rel_err`` (relative to scipy's MLE),
    ``loglik_minus_scipy`` (log-likelihood of our parameters minus that of scipy's on the same data: >= 0 means
    ours is at least as good a maximum), ``converged``.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or min(sizes) < 2 or repeats < 1 or scipy_repeats < 1:
        raise ValueError(
            f"sizes must be >= 2 and repeats >= 1, got sizes={sizes}, repeats={repeats}, scipy_repeats={scipy_repeats}"
        )
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    dev = bench_device(device)
    previous_threads = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        return pd.DataFrame(_rows(sizes, shape, scale, repeats, scipy_repeats, dev, dtype, seed))
    finally:
        torch.set_num_threads(previous_threads)


def _rows(
    sizes: list[int],
    shape: float,
    scale: float,
    repeats: int,
    scipy_repeats: int,
    dev: torch.device,
    dtype: str,
    seed: int,
) -> list[dict]:
    rows = []
    for size in sizes:
        rng = np.random.default_rng(seed)
        x = torch.from_numpy(rng.gamma(shape, scale, size)).to(getattr(torch, dtype))
        x64 = x.double().numpy()  # scipy sees exactly the values the estimators see
        x_dev = x.to(dev)
        ref_params: dict[str, dict[str, float]] = {}  # scipy's fit, its log-likelihood and time, per model
        ref_loglik: dict[str, float] = {}
        ref_ms: dict[str, float] = {}
        for dist in SCIPY_MODELS:
            ref_params[dist] = _scipy_fit(dist, x64)
            ref_loglik[dist] = _loglik(dist, ref_params[dist], x64)
            ref_ms[dist] = median_ms(functools.partial(_scipy_fit, dist, x64), scipy_repeats, warmup=0)
        for dist, method in sorted(ESTIMATORS):
            progress(f"bench estimators: size {size}, {dist} {method}")
            result = fit(x_dev, dist, method)
            # two untimed calls first: the first calls at a new size pay allocation and page faults, not the fit
            timing = time_ms(functools.partial(fit, x_dev, dist, method), repeats, dev, warmup=2)
            ms = timing.median
            ref = ref_params[dist]
            row = {
                "size": size,
                "dist": dist,
                "method": method,
                "ms": ms,
                "ms_min": timing.low,
                "ms_max": timing.high,
                "scipy_ms": ref_ms[dist],
                "speedup": ref_ms[dist] / ms,
                "converged": result.converged,
            }
            for key in ("shape", "scale"):
                ours = float(result.params[key]) if key in result.params else float("nan")
                row[key] = ours
                row[f"{key}_rel_err"] = abs(ours / ref[key] - 1) if key in ref else float("nan")
            ours_params = {k: float(v) for k, v in result.params.items()}
            row["loglik_minus_scipy"] = _loglik(dist, ours_params, x64) - ref_loglik[dist]
            rows.append(row)
    return rows
