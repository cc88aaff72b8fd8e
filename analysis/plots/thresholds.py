"""Threshold-quality figure: k_hat/k per estimator with its mean, 90 % interval over steps and the binomial band
of a perfect fit, one panel per target ratio (SIDCo, Abdelmoniem et al., Fig. 1(c) / Fig. 9
style)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from gradstat.analysis.plots.common import legend_outside, log_axis, new_figure, save_figure


def k_ratio(summary: pd.DataFrame, out_dir: str | os.PathLike, stem: str) -> dict[str, Path]:
    """``summary`` from :func:`gradstat.analysis.studies.thresholds.threshold_study`."""
    if summary.empty:
        raise ValueError("k_ratio: empty summary")
    ratios = sorted(summary["ratio"].unique(), reverse=True)
    fig, ax = new_figure(len(ratios), width=4.2, height=3.8)
    for j, r in enumerate(ratios):
        a = ax[0, j]
        s = summary[summary["ratio"] == r].reset_index(drop=True)
        y = np.arange(len(s))
        a.axvspan(s["band_low"].iloc[0], s["band_high"].iloc[0], color="0.85", label="binomial 90 % band")
        a.axvline(1.0, color="k", lw=0.8)
        a.errorbar(
            s["mean"],
            y,
            xerr=[s["mean"] - s["q05"], s["q95"] - s["mean"]],
            fmt="o",
            capsize=3,
            label="mean, 90 % interval",
        )
        for yi, m in zip(y, s["mean"], strict=True):
            if m <= 0:  # nothing selected: no point on a log axis, so say it
                a.text(0.02, yi, "k_hat = 0", transform=a.get_yaxis_transform(), fontsize=6, va="center")
        a.set_yticks(y, s["estimator"], fontsize=7)
        a.set(xlabel="k_hat / k (log)", title=f"delta = {r:g}", xscale="log")
        log_axis(a.xaxis, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0))
        a.tick_params(axis="x", labelsize=7, labelrotation=45)
        if j == len(ratios) - 1:
            legend_outside(a)
    return save_figure(fig, summary, out_dir, stem)
