"""eta vs beta: the residual bound of QCS Lemma 4 ((15) unbiased, (16) MMSE as printed) over the feedback weight,
beta* and eta* of Remark 2, Karimireddy's eta_k, and the measured max_t E||r_t||^2 / B with its interval."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from gradstat.analysis.plots.common import new_figure, save_figure


def eta_vs_beta(summary: pd.DataFrame, theory: pd.DataFrame, out_dir: str | os.PathLike, stem: str) -> dict[str, Path]:
    """``summary`` from :func:`gradstat.analysis.studies.feedback.feedback_table` (one compressor); ``theory`` the
    bound over a grid of beta (columns ``beta, eta``; :func:`gradstat.analysis.studies.feedback.eta_curve`)."""
    if summary.empty:
        raise ValueError("eta_vs_beta: empty summary")
    first = summary.iloc[0]
    kind = None if pd.isna(first["bound_kind"]) else str(first["bound_kind"])
    grid = theory["beta"].to_numpy(dtype=float)
    curve = theory["eta"].to_numpy(dtype=float)
    data = pd.concat([summary.assign(series="empirical"), theory.assign(series="theory")], ignore_index=True)
    fig, ax = new_figure()
    a = ax[0, 0]
    finite = np.isfinite(curve)
    if finite.any():
        a.plot(
            grid[finite],
            np.asarray(curve)[finite],
            "b-",
            label=f"eta(beta), {kind} {'(15)' if kind == 'unbiased' else '(16)'}",
        )
    if math.isfinite(first["eta_star"]):
        a.plot([first["beta_star"]], [first["eta_star"]], "b*", ms=12, label="beta*, eta* (17)/(18)")
    if math.isfinite(first["eta_karimireddy"]):
        a.axhline(first["eta_karimireddy"], color="tab:red", ls="--", label="Karimireddy eta_k")
    a.errorbar(
        summary["beta"],
        summary["empirical"],
        yerr=[summary["empirical"] - summary["ci_low"], summary["ci_high"] - summary["empirical"]],
        fmt="ko",
        capsize=3,
        label="max_t E||r_t||^2 / B",
    )
    a.set(
        xlabel="feedback weight beta",
        ylabel="eta",
        yscale="log",
        title=f"residual bound (gamma = {first['gamma']:.3g})" if not pd.isna(first["gamma"]) else "residual",
    )
    a.legend(fontsize=7)
    return save_figure(fig, data, out_dir, stem)
