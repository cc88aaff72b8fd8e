"""Summary table and figures of a distributed training run (``steps.csv`` of :mod:`.distributed`).

The summary has one row per run: its status (``ok``, or the step where compression failed and why), final loss (mean
over ranks of the last step's local losses, and of the last tenth of the steps), medians over steps (after
``warmup`` steps) and ranks of the step time and of the time in the hook, means per rank and step of the exact
payload bits, serialised bytes and bytes handed to the collectives, and the ratios of bytes and step time to the
all-reduce run of the same launch. The figures plot the mean loss over ranks against the step and against the
cumulative bits sent per rank. They are drawn here with matplotlib from the measured table (the training room sits
beside ``plots/``, not above it).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

BASELINE = "allreduce"


def summarize(steps: pd.DataFrame, warmup: int = 2) -> pd.DataFrame:
    """One row per run, in launch order (see the module docstring). ``warmup`` first steps are left out of the
    time medians (DDP builds and rebuilds its buckets there)."""
    if steps.empty:
        raise ValueError("no steps to summarise")
    rows = []
    for run, all_rows in steps.groupby("run", sort=False):
        errors = all_rows["error"].dropna() if "error" in all_rows else pd.Series([], dtype=object)
        errors = errors[errors.astype(str) != ""]
        df = all_rows[~all_rows.index.isin(errors.index)]
        if df.empty:
            rows.append({"run": run, "status": f"failed at step 0: {str(errors.iloc[0])[:160]}"})
            continue
        last = int(df["step"].max())
        tail = df[df["step"] > last - max(1, (last + 1) // 10)]
        timed = df[df["step"] >= warmup] if (df["step"] >= warmup).any() else df
        rows.append(
            {
                "run": run,
                "status": "ok"
                if errors.empty
                else f"stopped at step {int(all_rows.loc[errors.index, 'step'].min())}: {str(errors.iloc[0])[:160]}",
                "ranks": int(df["rank"].nunique()),
                "buckets": int(df[df["step"] == last]["buckets"].max()),
                "steps": last + 1,
                "first_loss": float(df[df["step"] == 0]["loss"].mean()),
                "final_loss": float(df[df["step"] == last]["loss"].mean()),
                "final_loss_tail": float(tail["loss"].mean()),
                "step_ms": 1e3 * float(timed["step_seconds"].median()),
                "hook_ms": 1e3 * float(timed["hook_seconds"].median()),
                "bits_per_rank_step": float(df["bits"].mean()),
                "wire_bytes_per_rank_step": float(df["wire_bytes"].mean()),
                "sent_bytes_per_rank_step": float(df["sent_bytes"].mean()),
            }
        )
    out = pd.DataFrame(rows)
    base = out[out["run"] == BASELINE]
    if not base.empty:
        out["bytes_vs_allreduce"] = out["sent_bytes_per_rank_step"] / float(base["sent_bytes_per_rank_step"].iloc[0])
        out["step_time_vs_allreduce"] = out["step_ms"] / float(base["step_ms"].iloc[0])
    return out


def write_report(results: Path, steps: pd.DataFrame | None = None) -> list[Path]:
    """Summarise ``results/steps.csv`` (or ``steps``) into ``summary.csv``/``.md`` and draw the figures beside it;
    the paths written. The single-machine launcher calls it after the ranks; under torchrun (several nodes) rank 0
    calls it once every rank has finished."""
    from gradstat.analysis.measure.tables import write_table

    steps = pd.read_csv(results / "steps.csv") if steps is None else steps
    return [*write_table(summarize(steps), results, "summary").values(), *figures(steps, results)]


def failed_runs(summary: pd.DataFrame) -> list[str]:
    """``run: why`` for each run of the summary that did not train to the end with a finite loss: stopped by an
    error (a compressor refusing a NaN gradient after divergence, ...) or ending with a non-finite loss."""
    out = []
    for _, row in summary.iterrows():
        status = str(row["status"])
        loss = row.get("final_loss", float("nan"))
        if status != "ok":
            out.append(f"{row['run']}: {status}")
        elif not math.isfinite(float(loss)):
            out.append(f"{row['run']}: final loss {loss}")
    return out


def failure_line(summary: pd.DataFrame) -> str | None:
    """The first line ``gradstat train`` prints when a run diverged or stopped (naming each, as
    :func:`failed_runs`), or None when every run trained."""
    failed = failed_runs(summary)
    if not failed:
        return None
    return f"gradstat: {len(failed)} of {len(summary)} runs diverged or stopped: {'; '.join(failed)}"


def figures(steps: pd.DataFrame, out: Path) -> list[Path]:
    """``loss_vs_step.png`` and ``loss_vs_bits.png`` in ``out`` (mean over ranks; bits cumulative per rank)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "error" in steps:
        steps = steps[steps["error"].isna() | (steps["error"].astype(str) == "")]
    per_step = steps.groupby(["run", "step"], sort=False).agg(loss=("loss", "mean"), bits=("bits", "mean"))
    per_step = per_step.reset_index()
    paths = []
    for name, x, xlabel, log in (
        ("loss_vs_step", "step", "step", False),
        ("loss_vs_bits", "cum_bits", "bits sent per rank (cumulative)", True),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for run, df in per_step.groupby("run", sort=False):
            df = df.sort_values("step").assign(cum_bits=lambda d: d["bits"].cumsum())
            ax.plot(df[x], df["loss"], label=str(run), lw=1.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss (mean over ranks)")
        if log:
            ax.set_xscale("log")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
