"""QCS Fig. 3 reproduced: variance factor vs compression gain, theory curves and measured points, log axes."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from gradstat.analysis.plots.common import legend_outside, log_axis, new_figure, save_figure

STYLE = {"QCS (min over k, Q)": "tab:blue", "QSGD (Lemma 3.1)": "tab:orange", "Wangni (uniform p)": "tab:green"}


def variance_vs_gain(
    curves: pd.DataFrame, points: pd.DataFrame | None, out_dir: str | os.PathLike, stem: str, n: int
) -> dict[str, Path]:
    """``curves`` from :func:`gradstat.analysis.studies.variance_gain.theory_curves`, ``points`` from
    ``empirical_points``."""
    fig, ax = new_figure(width=6.0, height=4.2)
    a = ax[0, 0]
    for method, grp in curves.groupby("method", sort=False):
        grp = grp.sort_values("gain")
        a.loglog(grp["gain"], grp["gamma"], "-", color=STYLE.get(method), label=f"{method}: bound")
    frames = [curves.assign(series="theory")]
    if points is not None and not points.empty:
        for method, grp in points.groupby("method", sort=False):
            a.errorbar(
                grp["gain"],
                grp["empirical"],
                yerr=[grp["empirical"] - grp["ci_low"], grp["ci_high"] - grp["empirical"]],
                fmt="o",
                mfc="none",
                color=STYLE.get(method),
                label=f"{method}: measured",
            )
        frames.append(points.assign(series="measured"))
    a.set(xlabel="compression gain", ylabel="E||g - g_hat||^2 / ||g||^2", title=f"variance vs gain (n = {n})")
    log_axis(a.xaxis)
    legend_outside(a)
    return save_figure(fig, pd.concat(frames, ignore_index=True), out_dir, stem)
