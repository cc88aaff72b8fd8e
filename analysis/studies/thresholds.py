"""Threshold quality over a dump: k_hat/k per step for each threshold estimator (SIDCo Fig. 1(c) / Fig. 9).

Every estimator is a registered sparsifier with a ``ratio`` field (the spec templates in :data:`ESTIMATORS`); at
each selected step it encodes the gradient (with its own state across steps, so SIDCo's adaptive stage count
evolves as in training) and k_hat is the number of indices it sends; k = ceil(delta d). Per estimator and ratio
the summary gives the mean of k_hat/k, the central 90 % interval over steps (SIDCo's estimation-quality metric,
SIDCo (Abdelmoniem et al.) Sec. 4) and the band a perfect fit would give: the central 90 % interval of
Binomial(d, delta) / k (:func:`gradstat.theory.sidco.exceedance_count_interval`, App. C). Estimators whose compressor is
not registered are skipped and listed in the summary's ``missing`` attribute.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from gradstat import compressors
from gradstat.analysis.measure.intervals import quantile_interval
from gradstat.analysis.measure.tables import CsvLog, write_table
from gradstat.compressors import Context

ESTIMATORS: dict[str, str] = {
    "topk": "topk:ratio={r}",
    "sidco-exp-M1": "sidco:ratio={r},dist=exp,stages=1,exact_fallback=false",
    "sidco-exp-M2": "sidco:ratio={r},dist=exp,stages=2,exact_fallback=false",
    "sidco-exp-M3": "sidco:ratio={r},dist=exp,stages=3,exact_fallback=false",
    "sidco-exp-M4": "sidco:ratio={r},dist=exp,stages=4,exact_fallback=false",
    "sidco-exp-adaptive": "sidco:ratio={r},dist=exp,stages=adaptive,exact_fallback=false",
    "sidco-gamma-M1": "sidco:ratio={r},dist=gamma,stages=1,exact_fallback=false",
    "sidco-gamma-M1-approx": "sidco:ratio={r},dist=gamma,stages=1,quantile=approx,exact_fallback=false",
    "sidco-gamma-M2": "sidco:ratio={r},dist=gamma,stages=2,exact_fallback=false",
    "sidco-gp-M1": "sidco:ratio={r},dist=gp,stages=1,exact_fallback=false",
    "sidco-gp-M2": "sidco:ratio={r},dist=gp,stages=2,exact_fallback=false",
    "dgc": "dgc:ratio={r}",
    "redsync": "redsync:ratio={r},exact_fallback=false",
    "gaussianksgd": "gaussianksgd:ratio={r}",
}
"""label -> compressor spec template (``{r}`` is the target ratio). The threshold rules run without their exact
fallback (``exact_fallback=false``): the quality measured is the threshold's own, a selection of none included."""
COVERAGE = 0.9


def available(estimators: Sequence[str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The estimators (label -> spec template) that can run here, and the labels that cannot (with why)."""
    labels = list(ESTIMATORS) if estimators is None else list(estimators)
    unknown = [e for e in labels if e not in ESTIMATORS]
    if unknown:
        raise ValueError(f"unknown threshold estimator(s) {', '.join(unknown)}; known: {', '.join(ESTIMATORS)}")
    ok, missing = {}, []
    for label in labels:
        spec = ESTIMATORS[label].format(r=0.01)
        name = spec.partition(":")[0]
        if name not in compressors.names():
            missing.append(f"{label} (compressor {name!r} not registered)")
            continue
        compressors.create(spec)
        ok[label] = ESTIMATORS[label]
    return ok, missing


def threshold_study(
    dump: Any,
    steps: Sequence[int],
    ratios: Sequence[float],
    worker: int = 0,
    estimators: Sequence[str] | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    progress: bool = False,
    on_rows: Callable[[list[dict]], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """k_hat/k of every estimator at every step and ratio, on the whole-model gradient of ``worker``.

    Returns
    -------
    (per_step, summary): ``per_step`` has ``estimator, ratio, step, d, k, k_hat, k_ratio``; ``summary`` has
    ``estimator, ratio, steps, mean, q05, q95, band_low, band_high, inside_band`` (fraction of steps whose k_hat
    lies in the binomial band) and ``.attrs["missing"]``.
    """
    from gradstat.theory.sidco import exceedance_count_interval

    ok, missing = available(estimators)
    if not ok:
        raise ValueError(f"no threshold estimator can run: {'; '.join(missing)}")
    comps = {(label, r): compressors.create(tpl.format(r=r)) for label, tpl in ok.items() for r in ratios}
    states = {key: c.new_state() for key, c in comps.items()}
    rows: list[dict] = []
    for step in tqdm(steps, desc="threshold", disable=not progress, leave=False):
        g = dump.flat(step, worker=worker, device=device, dtype=torch.float32)
        d = g.numel()
        new = []
        for (label, r), comp in comps.items():
            if d * r < 1:
                raise ValueError(f"--ratio {r} keeps fewer than one of the d={d} elements")
            k = math.ceil(r * d)
            payload = comp.encode(g, Context(seed=seed, step=int(step), state=states[(label, r)]))
            k_hat = payload.parts["indices"].tensor.numel()
            new.append(
                {
                    "estimator": label,
                    "ratio": r,
                    "step": int(step),
                    "d": d,
                    "k": k,
                    "k_hat": k_hat,
                    "k_ratio": k_hat / k,
                }
            )
        rows.extend(new)
        if on_rows is not None:
            on_rows(new)
    per_step = pd.DataFrame(rows)
    out = []
    for (label, r), grp in per_step.groupby(["estimator", "ratio"], sort=False):
        x = grp["k_ratio"].to_numpy()
        q05, q95 = quantile_interval(x, COVERAGE)
        d, k = int(grp["d"].iloc[0]), int(grp["k"].iloc[0])
        lo, hi = exceedance_count_interval(d, r, COVERAGE)
        out.append(
            {
                "estimator": label,
                "ratio": r,
                "steps": len(x),
                "mean": float(np.mean(x)),
                "q05": q05,
                "q95": q95,
                "band_low": lo / k,
                "band_high": hi / k,
                "inside_band": float(np.mean((grp["k_hat"] >= lo) & (grp["k_hat"] <= hi))),
            }
        )
    summary = pd.DataFrame(out)
    summary.attrs["missing"] = missing
    return per_step, summary


def run(
    dump: Any,
    out: Path,
    steps: Sequence[int],
    ratios: Sequence[float],
    worker: int,
    estimators: Sequence[str] | None,
    device: torch.device,
    seed: int = 0,
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Threshold quality (``analysis.studies.thresholds``) and its figure."""
    from gradstat.analysis.plots.thresholds import k_ratio

    log = CsvLog(out / "threshold_steps.csv")
    try:
        per_step, summary = threshold_study(
            dump, steps, ratios, worker, estimators, seed, device, progress, on_rows=log.add
        )
    finally:
        log.close()
    write_table(summary, out, "threshold_summary")
    k_ratio(summary, out, "threshold_k_ratio")
    return per_step, summary
