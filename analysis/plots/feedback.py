"""eta vs beta: the residual bounds of QCS (Abdi & Fekri, Quantized Compressive Sampling) Lemma 4 over the feedback
weight, each drawn only where it is valid -- (15) for unbiased QCS on 0 < beta < min(1, 2/(1+gamma)), (16) as
printed for MMSE-QCS where its base is positive, the Minkowski reading ``eta_minkowski`` on (0, 1], Karimireddy
et al.'s eta_k (Remark 3) as one point at beta = 1 -- with beta* and eta* of Remark 2 and the measured
max_t E||r_t||^2 / B with its interval. Log y axis; legend outside the data."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from gradstat.analysis.plots.common import legend_outside, new_figure, save_figure

STYLE = {
    "eta": ("b-", "eta(beta), {eq}"),
    "eta_minkowski": ("g--", "eta_minkowski (Lemma 3 + (14), Minkowski)"),
    "karimireddy": ("rD", "Karimireddy eta_k (beta = 1)"),
}


def eta_vs_beta(summary: pd.DataFrame, theory: pd.DataFrame, out_dir: str | os.PathLike, stem: str) -> dict[str, Path]:
    """``summary`` from :func:`gradstat.analysis.studies.feedback.feedback_table` (one compressor); ``theory`` the
    bounds over beta (columns ``beta, bound, value``; :func:`gradstat.analysis.studies.feedback.eta_curve`)."""
    if summary.empty:
        raise ValueError("eta_vs_beta: empty summary")
    first = summary.iloc[0]
    kind = None if pd.isna(first["bound_kind"]) else str(first["bound_kind"])
    eq = "(15)" if kind == "unbiased" else "(16) as printed"
    data = pd.concat(
        [summary.assign(series="empirical"), theory.assign(series="theory")], ignore_index=True, sort=False
    )
    fig, ax = new_figure(width=6.4)
    a = ax[0, 0]
    for bound, (fmt, label) in STYLE.items():
        part = theory[theory["bound"] == bound]
        if not part.empty:
            a.plot(part["beta"], part["value"], fmt, label=label.format(eq=eq))
    if math.isfinite(first["eta_star"]):
        a.plot([first["beta_star"]], [first["eta_star"]], "b*", ms=12, label="beta*, eta* (17)/(18)")
    a.errorbar(
        summary["beta"],
        summary["empirical"],
        yerr=[summary["empirical"] - summary["ci_low"], summary["ci_high"] - summary["empirical"]],
        fmt="ko",
        capsize=3,
        label="max_t E||r_t||^2 / B (99 % CI)",
    )
    a.set(
        xlabel="feedback weight beta",
        ylabel="||r||^2 / B",
        yscale="log",
        xlim=(0, 1.05),
        title=f"residual bound (gamma = {first['gamma']:.3g})" if not pd.isna(first["gamma"]) else "residual",
    )
    legend_outside(a)
    return save_figure(fig, data, out_dir, stem)
