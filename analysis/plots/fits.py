"""Distribution-fit figures: PDF and CDF of |g| with the fitted curves (SIDCo, Abdelmoniem et al., Fig. 2
style, log axes where tails matter), QQ plot, tail check and parameter drift over steps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from gradstat.analysis.plots.common import legend_outside, log_axis, new_figure, save_figure

COLORS = {"exponential": "tab:blue", "gamma": "tab:orange", "genpareto": "tab:green"}
MARKERS = {"exponential": "o", "gamma": "s", "genpareto": "^"}
"""One shape per family in every figure (colour and shape both name the family; line style names the method)."""


def _fits(a: torch.Tensor, families: Sequence[str], method: str) -> dict:
    from gradstat.theory.estimators import fit

    return {f: fit(a, f, method).distribution for f in families}


def _np(x: object) -> np.ndarray:
    return np.asarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float64)


def pdf_cdf(
    g: torch.Tensor,
    out_dir: str | os.PathLike,
    stem: str,
    method: str = "mle",
    families: Sequence[str] = ("exponential", "gamma", "genpareto"),
    title: str = "",
) -> dict[str, Path]:
    """Left: density of the nonzero |g| (log-spaced histogram) with each fitted pdf, log-log axes. Right: empirical
    survival function P(|g| > x) with the fitted ones, log-log axes (the tail the thresholds live in)."""
    a = g.detach().reshape(-1).abs().double().cpu()
    nz = a[a > 0]
    if nz.numel() < 2:
        raise ValueError("pdf_cdf: fewer than 2 nonzero values")
    dists = _fits(nz, families, method)
    x = np.sort(_np(nz))
    edges = np.geomspace(x[max(0, len(x) // 10000)], x[-1], 60)
    hist, _ = np.histogram(x, bins=edges, density=False)
    centers = np.sqrt(edges[1:] * edges[:-1])
    density = hist / (np.diff(edges) * len(x))
    sf_emp = 1.0 - np.searchsorted(x, centers, side="right") / len(x)
    data = pd.DataFrame({"x": centers, "empirical_pdf": density, "empirical_sf": sf_emp})
    fig, ax = new_figure(2)
    ax[0, 0].loglog(centers, np.where(density > 0, density, np.nan), "k.", label="|g| (histogram)")
    ax[0, 1].loglog(centers, np.where(sf_emp > 0, sf_emp, np.nan), "k.", label="empirical")
    for fam, dist in dists.items():
        pdf = _np(dist.pdf(torch.from_numpy(centers)))
        sf = _np(dist.sf(torch.from_numpy(centers)))
        data[f"{fam}_pdf"], data[f"{fam}_sf"] = pdf, sf
        ax[0, 0].loglog(centers, pdf, color=COLORS.get(fam), label=fam)
        ax[0, 1].loglog(centers, sf, color=COLORS.get(fam), label=fam)
    pos = density[density > 0]
    ax[0, 0].set(
        xlabel="|g|",
        ylabel="density",
        title=title or f"PDF of |g| ({method} fits)",
        ylim=(pos.min() / 10, pos.max() * 10),
    )
    ax[0, 1].set(xlabel="x", ylabel="P(|g| > x)", title="survival function", ylim=(0.5 / len(x), 1.5))
    legend_outside(ax[0, 1])
    return save_figure(fig, data, out_dir, stem)


def qq(
    g: torch.Tensor,
    out_dir: str | os.PathLike,
    stem: str,
    method: str = "mle",
    families: Sequence[str] = ("exponential", "gamma", "genpareto"),
    points: int = 200,
) -> dict[str, Path]:
    """Fitted quantiles against empirical quantiles of the nonzero |g| at ``points`` probabilities (log axes)."""
    a = g.detach().reshape(-1).abs().double().cpu()
    nz = a[a > 0]
    dists = _fits(nz, families, method)
    probs = 1.0 - np.geomspace(1.0 / nz.numel(), 0.5, points)[::-1]
    emp = np.quantile(_np(nz), probs)
    data = pd.DataFrame({"probability": probs, "empirical": emp})
    fig, ax = new_figure()
    for fam, dist in dists.items():
        data[fam] = _np(dist.ppf(torch.from_numpy(probs)))
        ax[0, 0].loglog(emp, data[fam], MARKERS.get(fam, "."), ms=3, mfc="none", color=COLORS.get(fam), label=fam)
    lim = [emp.min(), emp.max()]
    ax[0, 0].loglog(lim, lim, "k--", lw=0.8, label="y = x")
    ax[0, 0].set(xlabel="empirical quantile of |g|", ylabel="fitted quantile", title=f"QQ plot ({method})")
    legend_outside(ax[0, 0])
    return save_figure(fig, data, out_dir, stem)


def tail_check(fits: pd.DataFrame, out_dir: str | os.PathLike, stem: str, scope: str = "model") -> dict[str, Path]:
    """Mean over steps of count(|g| > eta(delta)) / (d delta) against delta, per family and method; 1 = perfect."""
    cols = [c for c in fits.columns if c.startswith("tail_")]
    sel = fits[fits["scope"] == scope]
    if sel.empty or not cols:
        raise ValueError(f"tail_check: no fits for scope {scope!r}")
    data = sel.groupby(["family", "method"])[cols].mean().reset_index()
    deltas = [float(c[5:]) for c in cols]
    fig, ax = new_figure()
    for _, row in data.iterrows():
        ax[0, 0].semilogx(
            deltas,
            [row[c] for c in cols],
            MARKERS.get(row["family"], "o") + ("-" if row["method"] == "mle" else "--"),
            color=COLORS.get(row["family"]),
            label=f"{row['family']} ({row['method']})",
        )
    ax[0, 0].axhline(1.0, color="k", lw=0.8)
    ax[0, 0].set(xlabel="target ratio delta", ylabel="k_hat / (d delta)", title="tail check (single-stage fit)")
    ax[0, 0].invert_xaxis()
    ax[0, 0].set_xticks(deltas, [f"{d:g}" for d in deltas])
    legend_outside(ax[0, 0])
    return save_figure(fig, data, out_dir, stem)


def drift(
    data: pd.DataFrame, out_dir: str | os.PathLike, stem: str, scope: str = "model", method: str = "mle"
) -> dict[str, Path]:
    """Fitted scale and shape per step (one line per family); ``data`` has columns ``step, family, scale, shape``
    (:func:`gradstat.analysis.studies.fits.drift`)."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = new_figure(2)
    for fam, grp in data.groupby("family"):
        style = MARKERS.get(fam, "o") + "-"
        ax[0, 0].plot(grp["step"], grp["scale"], style, color=COLORS.get(fam), label=fam)
        if grp["shape"].notna().any():
            ax[0, 1].plot(grp["step"], grp["shape"], style, color=COLORS.get(fam), label=fam)
    ax[0, 0].set(xlabel="step", ylabel="scale (beta)", title=f"scale drift ({method}, {scope})", yscale="log")
    ax[0, 1].set(xlabel="step", ylabel="shape (alpha)", title="shape drift")
    for a in ax[0]:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers
    log_axis(ax[0, 0].yaxis, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0))
    legend_outside(ax[0, 1], source=ax[0, 0])  # every family has a scale; not every one a shape
    return save_figure(fig, data, out_dir, stem)
