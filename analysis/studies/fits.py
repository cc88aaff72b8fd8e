"""Distribution fits of gradient magnitudes |g| over a dump: per step, per layer and for the whole model.

For each vector (a layer's or the whole model's gradient at a step, optionally l2-normalised as in SIDCo's
figures, optionally the error-compensated gradient when the dump recorded it) and each family (double
exponential / Laplace, double gamma, double generalized Pareto; SIDCo (Abdelmoniem et al.) Sec. 2.3) and
estimator (closed form or MLE, :func:`gradstat.theory.estimators.fit`), one table row holds:

- ``scale``, ``shape`` (NaN for the exponential), ``n`` (nonzero values fitted), ``zero_fraction``;
- ``loglik`` on the nonzero |g| and ``aic = 2 n_params - 2 loglik``; ``aic_rank`` (1 = best) among the families
  fitted by the same estimator on the same vector;
- ``ks`` and ``ad``: Kolmogorov-Smirnov and Anderson-Darling statistics of the fitted CDF on a **subsample** of at
  most ``SUBSAMPLE`` nonzero |g| values drawn uniformly without replacement with a fixed seed (exact statistics on
  millions of values cost more than they tell; the subsample size is in the table as ``gof_n``);
- ``tail_<delta>`` for delta in 0.1, 0.01, 0.001: the number of |g| above the fitted threshold eta(delta)
  (:func:`gradstat.theory.thresholds.threshold`, exact quantile) divided by ``d * delta`` (1 = perfect; SIDCo's
  estimation quality k_hat/k for a single-stage fit);
- ``p``: the compressibility exponent of the sorted magnitudes, |g|_(j) <= c j^-p (SIDCo Def. 1), from
  :mod:`gradstat.theory.sparsification`.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from gradstat.analysis.measure.tables import CsvLog, write_table

FAMILIES = ("exponential", "gamma", "genpareto")
METHODS = ("closed_form", "mle")
DELTAS = (0.1, 0.01, 0.001)
SUBSAMPLE = 20_000
"""Largest number of nonzero |g| values the KS and Anderson-Darling statistics are computed on."""
N_PARAMS = {"exponential": 1, "gamma": 2, "genpareto": 2}


def _cdf_array(dist: Any, x: np.ndarray) -> np.ndarray:
    return np.asarray(dist.cdf(x))


def goodness_of_fit(x_sorted: np.ndarray, cdf: Callable[[np.ndarray], np.ndarray]) -> tuple[float, float]:
    """KS statistic ``sup |F_n - F|`` and Anderson-Darling ``A^2`` of sorted samples against ``cdf``.

    ``A^2 = -n - (1/n) sum_i (2i - 1) [ln F(x_i) + ln(1 - F(x_{n+1-i}))]`` with F clipped to [1e-300, 1 - 1e-16]
    so a value outside the fitted support gives a large finite statistic instead of inf.
    """
    n = x_sorted.size
    if n == 0:
        raise ValueError("goodness_of_fit: no samples")
    f = np.clip(np.asarray(cdf(x_sorted), dtype=np.float64), 1e-300, 1 - 1e-16)
    i = np.arange(1, n + 1)
    ks = float(max(np.max(i / n - f), np.max(f - (i - 1) / n)))
    ad = float(-n - np.sum((2 * i - 1) * (np.log(f) + np.log1p(-f[::-1]))) / n)
    return ks, ad


def subsample(nonzero_abs: torch.Tensor, size: int = SUBSAMPLE, seed: int = 0) -> np.ndarray:
    """Sorted float64 numpy subsample (without replacement, fixed seed) of at most ``size`` values."""
    n = nonzero_abs.numel()
    if n > size:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        idx = torch.randperm(n, generator=gen)[:size].to(nonzero_abs.device)
        nonzero_abs = nonzero_abs[idx]
    return np.sort(nonzero_abs.double().cpu().numpy())


def fit_vector(
    g: torch.Tensor,
    families: Sequence[str] = FAMILIES,
    methods: Sequence[str] = METHODS,
    deltas: Sequence[float] = DELTAS,
    gof_size: int = SUBSAMPLE,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Fit every (family, method) to ``|g|`` of a 1-D gradient; one dict per fit (columns in the module docstring).

    Raises
    ------
    ValueError : ``g`` empty, non-finite or all zeros; unknown family or method (from the estimator).
    """
    from gradstat.theory.estimators import fit
    from gradstat.theory.sparsification import fit_magnitude_decay
    from gradstat.theory.thresholds import threshold

    if g.numel() == 0:
        raise ValueError("cannot fit an empty gradient")
    a = g.detach().reshape(-1).abs()
    if not bool(torch.isfinite(a).all()):
        raise ValueError("the gradient holds NaN/Inf values; cannot fit")
    nz = a[a > 0]
    if nz.numel() < 2:
        raise ValueError(f"the gradient has {nz.numel()} nonzero value(s); a fit needs at least 2")
    d = a.numel()
    sample = subsample(nz, gof_size, seed)
    p = fit_magnitude_decay(a.double().cpu().numpy()).p
    rows = []
    for method in methods:
        for family in families:
            f = fit(a, family, method)
            dist = f.distribution
            loglik = float(torch.as_tensor(dist.logpdf(nz.double())).sum())
            ks, ad = goodness_of_fit(sample, functools.partial(_cdf_array, dist))
            row = {
                "family": family,
                "method": method,
                "scale": float(f.params.get("scale", math.nan)),
                "shape": float(f.params.get("shape", math.nan)),
                "n": int(f.n),
                "d": d,
                "zero_fraction": float(f.zero_fraction),
                "loglik": loglik,
                "aic": 2 * N_PARAMS[family] - 2 * loglik,
                "ks": ks,
                "ad": ad,
                "gof_n": sample.size,
            }
            for delta in deltas:
                if d * delta < 1:
                    row[f"tail_{delta:g}"] = math.nan
                    continue
                eta = float(threshold(f, delta, quantile="exact"))
                row[f"tail_{delta:g}"] = float((a > eta).sum()) / (d * delta)
            row["p"] = p
            row["warnings"] = "; ".join(getattr(f, "warnings", ()) or ())
            rows.append(row)
    _rank(rows)
    return rows


def _rank(rows: list[dict[str, Any]]) -> None:
    for method in {r["method"] for r in rows}:
        group = sorted(
            (r for r in rows if r["method"] == method), key=lambda r: r["aic"] if math.isfinite(r["aic"]) else math.inf
        )
        for i, r in enumerate(group, 1):
            r["aic_rank"] = i


def fit_dump(
    dump: Any,
    steps: Sequence[int],
    workers: Sequence[int] = (0,),
    layers: Sequence[str] | None = None,
    scopes: Iterable[str] = ("model", "layer"),
    normalize: bool = False,
    compensated: bool = False,
    families: Sequence[str] = FAMILIES,
    methods: Sequence[str] = METHODS,
    device: torch.device | str = "cpu",
    progress: bool = False,
    on_rows: Callable[[list[dict]], None] | None = None,
) -> pd.DataFrame:
    """Fit |g| for each selected step and worker, for the whole model and/or each layer.

    Parameters
    ----------
    dump : opened dump (``analysis.dumps.open_dump``).
    steps, workers : selections (see :mod:`gradstat.analysis.measure.selection`).
    layers : parameter names for the ``layer`` scope (default all); the ``model`` scope uses all parameters.
    scopes : any of ``model`` and ``layer``.
    normalize : divide each vector by its l2 norm first (SIDCo Fig. 2).
    compensated : fit the error-compensated gradient the dump recorded (extra ``compensated``) instead of g.
    on_rows : called with each vector's rows as soon as they are computed.

    Returns
    -------
    DataFrame: ``step, worker, scope, variant`` and the columns of :func:`fit_vector`.
    """
    scopes = list(scopes)
    bad = set(scopes) - {"model", "layer"}
    if bad or not scopes:
        raise ValueError(f"scopes must be among model, layer; got {scopes}")
    if compensated and "compensated" not in (dump.extras or ()):
        raise ValueError(
            "the dump holds no error-compensated gradient (extra 'compensated'); record it with a "
            "compressor and feedback in the loop, or drop --compensated"
        )
    variant = ("compensated" if compensated else "gradient") + (", l2-normalised" if normalize else "")
    rows: list[dict] = []
    bar = tqdm(total=len(steps) * len(workers), desc="fit", disable=not progress, leave=False)
    for step in steps:
        for w in workers:
            vectors = []
            if "model" in scopes:
                flat = (
                    dump.flat_extra("compensated", step, worker=w, device=device)
                    if compensated
                    else dump.flat(step, worker=w, device=device)
                )
                vectors.append(("model", flat))
            if "layer" in scopes:
                named = (
                    dump.read_extra("compensated", step, worker=w, params=layers, device=device)
                    if compensated
                    else dump.read(step, worker=w, params=layers, device=device)
                )
                vectors.extend(named.items())
            new = []
            for scope, v in vectors:
                v = v.reshape(-1).float()
                if normalize:
                    nrm = v.norm()
                    if float(nrm) == 0.0:
                        continue
                    v = v / nrm
                if not bool((v != 0).any()) or int((v != 0).sum()) < 2:
                    continue  # a frozen or dead layer has nothing to fit
                for r in fit_vector(v, families, methods):
                    new.append({"step": step, "worker": w, "scope": scope, "variant": variant, **r})
            rows.extend(new)
            if on_rows is not None:
                on_rows(new)
            bar.update(1)
    bar.close()
    if not rows:
        raise ValueError("nothing to fit: every selected vector is all zeros")
    return pd.DataFrame(rows)


def drift(df: pd.DataFrame, scope: str = "model", method: str = "mle") -> pd.DataFrame:
    """Parameters per step for one scope and method (for the drift figure): ``step, family, scale, shape``."""
    sel = df[(df["scope"] == scope) & (df["method"] == method)]
    if sel.empty:
        raise ValueError(f"no fits for scope={scope!r}, method={method!r}")
    return sel.groupby(["step", "family"], as_index=False)[["scale", "shape"]].mean()


def run(
    dump: Any,
    out: Path,
    steps: Sequence[int],
    workers: Sequence[int],
    layers: Sequence[str] | None,
    scopes: Sequence[str],
    methods: Sequence[str],
    normalize: bool,
    compensated: bool,
    device: torch.device,
    progress: bool = True,
    figures: bool = True,
) -> pd.DataFrame:
    """Distribution fits (``analysis.studies.fits``) and their figures (on the last selected step, worker 0 of the
    selection, whole model)."""
    from gradstat.analysis.plots import fits as fplots

    log = CsvLog(out / "fits.csv")
    try:
        df = fit_dump(
            dump,
            steps,
            workers,
            layers,
            scopes,
            normalize,
            compensated,
            methods=methods,
            device=device,
            progress=progress,
            on_rows=log.add,
        )
    finally:
        log.close()
    write_table(df, out, "fits")
    if figures:
        step, w = steps[-1], workers[0]
        g = dump.flat_extra("compensated", step, worker=w) if compensated else dump.flat(step, worker=w)
        if normalize:
            g = g / g.norm()
        method = "mle" if "mle" in methods else methods[0]
        fplots.pdf_cdf(g, out, "fit_pdf_cdf", method, title=f"|g| at step {step} ({method} fits)")
        fplots.qq(g, out, "fit_qq", method)
        if "model" in scopes:
            fplots.tail_check(df, out, "fit_tail_check")
            fplots.drift(drift(df, "model", method), out, "fit_drift", scope="model", method=method)
    return df
