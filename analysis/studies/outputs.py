"""Each analysis as one call that computes it, writes its tables and figures into a folder and returns the frames:
the shared body of the ``gradstat`` commands and of the report (so both produce the same files).

File names written into ``out`` (CSV tables have a Markdown twin; every PNG has its CSV):
``fits.csv``, ``fit_pdf_cdf.png``, ``fit_qq.png``, ``fit_tail_check.png``, ``fit_drift.png``;
``threshold_steps.csv``, ``threshold_summary.csv``, ``threshold_k_ratio.png``; ``compress_steps.csv``,
``compress_summary.csv``; ``variance.csv``; ``feedback.csv``, ``feedback_steps.csv``, ``feedback_eta_vs_beta.png``;
``variance_vs_gain.png``; ``validation.csv``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from analysis.tables import atomic_write_text, write_table
from analysis.validation.vectors import GradientSource


class CsvLog:
    """Rows appended to a CSV as they come (nothing lost on interruption); the header is fixed by the first row."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] | None = None
        self._fh = None

    def add(self, rows: dict | list[dict]) -> None:
        rows = [rows] if isinstance(rows, dict) else rows
        if not rows:
            return
        if self._fh is None:
            self.columns = list(rows[0])
            self._fh = open(self.path, "w", encoding="utf-8")
            self._fh.write(",".join(self.columns) + "\n")
        for r in rows:
            self._fh.write(",".join(_csv_cell(r.get(c)) for c in self.columns) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _csv_cell(v: Any) -> str:
    s = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
    return f'"{s}"' if ("," in s or '"' in s) else s


def fits(dump: Any, out: Path, steps: Sequence[int], workers: Sequence[int], layers: Sequence[str] | None,
         scopes: Sequence[str], methods: Sequence[str], normalize: bool, compensated: bool,
         device: torch.device, progress: bool = True, figures: bool = True) -> pd.DataFrame:
    """Distribution fits (``analysis.fitting``) and their figures (on the last selected step, worker 0 of the
    selection, whole model)."""
    from analysis import fitting
    from analysis.plots import fits as fplots

    log = CsvLog(out / "fits.csv")
    try:
        df = fitting.fit_dump(dump, steps, workers, layers, scopes, normalize, compensated, methods=methods,
                              device=device, progress=progress, on_rows=log.add)
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
            fplots.drift(df, out, "fit_drift", method=method)
    return df


def thresholds(dump: Any, out: Path, steps: Sequence[int], ratios: Sequence[float], worker: int,
               estimators: Sequence[str] | None, device: torch.device, seed: int = 0,
               progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Threshold quality (``analysis.thresholding``) and its figure."""
    from analysis.plots.thresholds import k_ratio
    from analysis.thresholding import threshold_study

    log = CsvLog(out / "threshold_steps.csv")
    try:
        per_step, summary = threshold_study(dump, steps, ratios, worker, estimators, seed, device, progress,
                                            on_rows=log.add)
    finally:
        log.close()
    write_table(summary, out, "threshold_summary")
    k_ratio(summary, out, "threshold_k_ratio")
    return per_step, summary


def compress(dump: Any, out: Path, specs: Sequence[tuple[str, str]], steps: Sequence[int],
             workers: Sequence[int], seeds: Sequence[int], device: torch.device,
             progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replays (``analysis.replay``) of each (compressor, feedback) pair; per-step rows and a one-row-per-pair
    summary (means over steps and seeds)."""
    from analysis.replay import ReplayConfig, replay

    log = CsvLog(out / "compress_steps.csv")
    frames = []
    try:
        for comp, fb in specs:
            cfg = ReplayConfig(comp, fb, steps, workers, seeds, device)
            df = replay(dump, cfg, on_step=lambda r, c=comp, f=fb: log.add({"compressor": c, "feedback": f, **r}),
                        progress=progress)
            frames.append(df.assign(compressor=comp, feedback=fb))
    finally:
        log.close()
    per_step = pd.concat(frames, ignore_index=True)
    cols = ["rel_error", "agg_rel_error", "bias", "k_ratio", "bits", "entropy_bits", "gain", "residual_norm",
            "residual_rel"]
    summary = per_step.groupby(["compressor", "feedback"], sort=False)[cols].mean().reset_index()
    sd = per_step.groupby(["compressor", "feedback"], sort=False)["rel_error"].std(ddof=1).to_numpy()
    summary.insert(3, "rel_error_sd", sd)
    write_table(per_step, out, "compress_steps")
    write_table(summary, out, "compress_summary")
    return per_step, summary


def variance(vectors: Sequence[tuple[str, torch.Tensor]], specs: Sequence[str], out: Path, trials: int,
             seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """Monte Carlo relative error vs closed-form bound (``analysis.variance``)."""
    from analysis.variance import variance_table

    df = variance_table(specs, vectors, trials, seed, progress=progress)
    write_table(df, out, "variance")
    return df


def feedback(source: GradientSource, workers: Sequence[int], out: Path, spec: str, betas: Sequence[float],
             n: int, steps: int, seeds: int, device: torch.device, progress: bool = True,
             stem: str = "feedback") -> pd.DataFrame:
    """eta vs beta (``analysis.feedback_study``) on ``steps`` consecutive gradient blocks of length ``n``; files
    ``<stem>.csv``, ``<stem>_steps.csv``, ``<stem>_eta_vs_beta.png``."""
    from analysis.feedback_study import feedback_table
    from analysis.plots.feedback import eta_vs_beta

    sequence = []
    for t in range(steps):
        sequence.append([GradientSource(source.dump, source.steps, w, source.seed).vector(n, device, index=t)
                         for w in workers] if source.dump is not None else [source.vector(n, device, index=t)])
    summary, per_step = feedback_table(spec, betas, sequence, list(range(seeds)), progress=progress)
    write_table(summary, out, stem)
    write_table(per_step, out, f"{stem}_steps")
    eta_vs_beta(summary, out, f"{stem}_eta_vs_beta")
    return summary


def variance_gain(out: Path, n: int, source: GradientSource, trials: int, device: torch.device) -> pd.DataFrame:
    """QCS Fig. 3 with measured points (``analysis.variance_gain``)."""
    from analysis.plots.variance_gain import variance_vs_gain
    from analysis.variance_gain import empirical_points, theory_curves

    curves = theory_curves(n)
    points = empirical_points(n, source, trials, device=device)
    variance_vs_gain(curves, points, out, "variance_vs_gain", n)
    return points


def validation(out: Path, size: str, source: GradientSource | None, device: torch.device, seed: int = 0,
               checks: str | None = None, echo: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Run the checks (``analysis.validation``), writing ``validation.csv`` after each one."""
    from analysis.validation.engine import run_checks
    from analysis.validation.registry import select

    rows: list[dict] = []

    def done(r) -> None:
        rows.append(r.row())
        atomic_write_text(out / "validation.csv", pd.DataFrame(rows).to_csv(index=False))
        if echo is not None:
            e = r.estimate
            echo(f"  {r.check.name:28s} {r.verdict:9s} theory={_fmt(r.theory)} empirical="
                 f"{'-' if e is None else f'{e.mean:.4g} [{e.low:.4g}, {e.high:.4g}]'} ({r.seconds:.1f}s)")

    run_checks(select(checks), size, seed, device, source, on_result=done)
    df = pd.DataFrame(rows)
    write_table(df, out, "validation")
    return df


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"
