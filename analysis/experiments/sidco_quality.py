"""SIDCo estimation quality over training: k_hat/k of every threshold estimator, with error feedback in the loop.

SIDCo (Abdelmoniem et al., An Efficient Statistical-based Gradient Compression Technique), Sec. 4 ("Estimation
Quality: the compression ratio averaged over the training divided by the target ratio, with the 90 % confidence
interval"), Fig. 3(c)/(f), Fig. 9 and App. E: SIDCo's variants with adaptive stages, Top-k, DGC, RedSync and
GaussianKSGD at delta in {0.1, 0.01, 0.001}; plus gradstat's own count-corrected estimator
(:mod:`gradstat.compressors.schemes.sparsifiers.tailcount`) beside the paper's, and SIDCo's number of stages M over
time.

Setting: each workload trains for real (one worker, its own SGD settings) with Top-k at delta = 0.01 and plain
error feedback in the loop (one loop per workload, shared by the three ratios to fit this CPU); at every step every
estimator at every ratio, with its own state (SIDCo's adaptive M), selects from the vector the loop compresses,
z = g + h. The fixed-M SIDCo-GP rows (M = 1, 2, 3) run at the smallest ratio only. k = ceil(delta d); the summary
gives the mean of k_hat/k over the steps
and the central 90 % interval. The published rows are judged per step (:mod:`gradstat.analysis.experiments.rules`:
the share of steps meeting the claim, with its 99 % binomial interval, against the 90 % that SIDCo's 90 % intervals
imply; never on the mean): SIDCo and DGC "on average k_hat/k ~ 1" within SIDCo's tolerance eps = 20 % (Sec. 3, "The
proper selection of the distribution ..."), SIDCo's gamma-GP "over-estimation which is at most 2 times the target"
(App. E, Fig. 9), and RedSync and GaussianKSGD "two orders of magnitude lower than the target" at 0.001 on LSTM-PTB
only, where the paper states it (Sec. 4, Fig. 3(c)) -- a property of the authors' baselines, whose searches can move
away from their band; gradstat's versions always search towards it (see their modules), so that row is expected to
differ. gradstat's own estimator is held to its own target, mean k_hat/k within [0.9, 1.1] (a claim about the mean,
not a paper number).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence, TypedDict

import numpy as np
import pandas as pd
import torch

from gradstat.analysis.experiments.base import Comparison, Experiment, ExperimentResult
from gradstat.analysis.experiments.rules import per_step_share, stated_for
from gradstat.analysis.measure.intervals import quantile_interval
from gradstat.analysis.plots.common import new_figure, save_figure
from gradstat.analysis.training.parallel import DataParallel
from gradstat.analysis.training.workloads import get_workload, workload_names
from gradstat.compressors import Context, ErrorFeedback, create
from gradstat.compressors.schemes.sparsifiers.sidco import SIDCo
from gradstat.compressors.schemes.sparsifiers.stage_adaptation import StageState

ESTIMATORS: dict[str, str] = {
    "topk": "topk:ratio={r}",
    "dgc": "dgc:ratio={r}",
    "redsync": "redsync:ratio={r},exact_fallback=false",
    "gaussianksgd": "gaussianksgd:ratio={r}",
    "sidco-exp": "sidco:ratio={r},dist=exp,exact_fallback=false",
    "sidco-gamma": "sidco:ratio={r},dist=gamma,exact_fallback=false",
    "sidco-gp": "sidco:ratio={r},dist=gp,exact_fallback=false",
    "sidco-gp-M1": "sidco:ratio={r},dist=gp,stages=1,exact_fallback=false",
    "sidco-gp-M2": "sidco:ratio={r},dist=gp,stages=2,exact_fallback=false",
    "sidco-gp-M3": "sidco:ratio={r},dist=gp,stages=3,exact_fallback=false",
    "tailcount (gradstat)": "tailcount:ratio={r},exact_fallback=false",
}
"""label -> spec template; the three unsuffixed SIDCo rows adapt M (the ``error`` search), the -M rows fix it. The
threshold rules run without their exact fallback (``exact_fallback=false``): k_hat is the threshold's own count."""
RATIOS = (0.1, 0.01, 0.001)
LOOP_RATIO = 0.01
"""Top-k ratio of the training loop whose compensated vectors every estimator sees (one loop for all ratios)."""


class Size(TypedDict):
    workloads: tuple[str, ...]
    steps: int
    ratios: tuple[float, ...]


FULL: Size = {"workloads": ("resnet20", "lstm", "lenet"), "steps": 100, "ratios": RATIOS}
QUICK: Size = {"workloads": ("logreg",), "steps": 40, "ratios": (0.1, 0.01)}
COVERAGE = 0.9
SIDCO_EPS = 0.2
OWN_TOL = 0.1
REF = "SIDCo (Abdelmoniem et al.)"


def quality_run(
    workload: str, ratios: Sequence[float], steps: int, seed: int
) -> tuple[list[dict], dict[tuple[float, str], str]]:
    """Train ``workload`` for ``steps`` steps with Top-k at ``LOOP_RATIO`` and error feedback; at each step every
    estimator at every ratio selects from the compensated vector. The fixed-M rows run at the smallest ratio only.
    Returns the per-step rows and each adaptive estimator's final verdict, keyed by (ratio, label)."""
    wl = get_workload(workload)
    model = wl.model(seed)
    loop = DataParallel(
        model,
        wl.optimizer(model),
        wl.loss,
        workers=1,
        compressor=create(f"topk:ratio={LOOP_RATIO}"),
        feedback=ErrorFeedback.plain(),
        seed=seed,
    )
    comps = {
        (r, label): create(tpl.format(r=r))
        for r in ratios
        for label, tpl in ESTIMATORS.items()
        if "-M" not in label or r == min(ratios)
    }
    states = {key: c.new_state() for key, c in comps.items()}
    batches = wl.batches(seed)
    rows: list[dict] = []
    for step in range(steps):
        x, y = next(batches)
        z_named = loop.step(step, x, y).extras["compensated"][0]
        z = torch.cat([z_named[n].reshape(-1) for n, _ in loop.named])
        for (r, label), comp in comps.items():
            payload = comp.encode(z, Context(seed=seed, step=step, state=states[(r, label)]))
            rows.append(
                {
                    "workload": workload,
                    "ratio": r,
                    "estimator": label,
                    "step": step,
                    "d": z.numel(),
                    "k": math.ceil(r * z.numel()),
                    "k_hat": payload.parts["indices"].tensor.numel(),
                    "stages": payload.info.get("stages", np.nan),
                }
            )
    verdicts = {
        key: s.verdict(c.period, c.eps)
        for key, s in states.items()
        if isinstance(s, StageState) and isinstance(c := comps[key], SIDCo)  # stage states are SIDCo's
    }
    return rows, verdicts


def summarize(per_step: pd.DataFrame, verdicts: dict[tuple[str, float, str], str]) -> pd.DataFrame:
    """Mean and central 90 % interval of k_hat/k per (workload, ratio, estimator), with the adaptation verdict."""
    out = []
    for (w, r, label), grp in per_step.groupby(["workload", "ratio", "estimator"], sort=False):
        q = (grp["k_hat"] / grp["k"]).to_numpy()
        lo, hi = quantile_interval(q, COVERAGE)
        stages = grp["stages"].dropna()
        out.append(
            {
                "workload": w,
                "ratio": r,
                "estimator": label,
                "steps": len(q),
                "mean": float(np.mean(q)),
                "q05": lo,
                "q95": hi,
                "final_M": float(stages.iloc[-1]) if len(stages) else np.nan,
                "adaptation": verdicts.get((w, r, label), ""),
            }
        )
    return pd.DataFrame(out)


def run(out: Path, quick: bool, workloads: Sequence[str] | None, seed: int, device: str = "cpu") -> ExperimentResult:
    size = QUICK if quick else FULL
    chosen = list(workloads) if workloads else list(size["workloads"])
    rows: list[dict] = []
    verdicts: dict[tuple[str, float, str], str] = {}
    for w in chosen:
        new, v = quality_run(w, size["ratios"], size["steps"], seed)
        rows.extend(new)
        verdicts.update({(w, r, label): text for (r, label), text in v.items()})
    per_step = pd.DataFrame(rows)
    per_step["k_ratio"] = per_step["k_hat"] / per_step["k"]
    summary = summarize(per_step, verdicts)
    figures = _plot(summary, per_step, out)
    comparisons = _compare(summary, per_step)
    own = summary[summary["estimator"] == "tailcount (gradstat)"]
    notes = [
        "gradstat's tailcount mean k_hat/k: "
        + ", ".join(f"{r.workload} delta={r.ratio:g}: {r['mean']:.3f}" for _, r in own.iterrows())
        + f" (target [{1 - OWN_TOL:g}, {1 + OWN_TOL:g}]).",
        f"Vectors: the compensated gradient z = g + h of a training run with Top-k at delta = {LOOP_RATIO} and plain "
        "error feedback in the loop (one worker), shared by all ratios; every estimator keeps its own state.",
    ]
    for (w, r, label), text in verdicts.items():
        if label.startswith("sidco-") and r == min(size["ratios"]):
            notes.append(f"{w}, {label} adaptive at delta = {r:g}: {text}.")
    return ExperimentResult(
        tables={"quality_summary": summary, "quality_steps": per_step},
        figures=figures,
        comparisons=comparisons,
        notes=notes,
        settings={"workloads": chosen, "ratios": list(size["ratios"]), "steps": size["steps"], "feedback": "ef"},
    )


STATED_LSTM = ("lstm",)
"""Where SIDCo states RedSync's and GaussianKSGD's "two orders of magnitude lower than the target" (Sec. 4,
LSTM-PTB, Fig. 3(c)): the row exists for these workloads only."""


def _compare(summary: pd.DataFrame, per_step: pd.DataFrame) -> list[Comparison]:
    """The paper's per-step claims judged per step (:mod:`gradstat.analysis.experiments.rules`): the share of
    steps meeting each, with its interval, against the share SIDCo's 90 % intervals imply (``COVERAGE``)."""
    rows = []
    for _, s in summary.iterrows():
        q = per_step[
            (per_step["workload"] == s.workload)
            & (per_step["ratio"] == s.ratio)
            & (per_step["estimator"] == s.estimator)
        ]["k_ratio"].to_numpy()
        where = f"{s.workload}, delta={s.ratio:g}, {s.estimator}: share of steps with k_hat/k"

        def share(
            text: str, meets: Callable[[np.ndarray], np.ndarray], ref: str, q: np.ndarray = q, where: str = where
        ) -> Comparison:
            e = per_step_share(q, meets)
            return Comparison(f"{where} {text}", COVERAGE, ref, e.mean, kind="share", low=e.low, high=e.high)

        if s.estimator in ("sidco-exp", "sidco-gamma", "sidco-gp", "dgc"):
            rows.append(
                share(
                    f"within 1 +- {SIDCO_EPS:g}",
                    lambda v: np.abs(v - 1.0) <= SIDCO_EPS,
                    REF + ", Sec. 3 and Fig. 9 ('on average k_hat/k ~ 1', eps = 20 %)",
                )
            )
        if s.estimator == "sidco-gamma":
            rows.append(share("<= 2", lambda v: v <= 2.0, REF + ", App. E, Fig. 9 ('at most 2 times')"))
        if s.estimator in ("redsync", "gaussianksgd") and s.ratio == 0.001 and stated_for(s.workload, STATED_LSTM):
            rows.append(
                share(
                    "<= 0.02 (two orders of magnitude below the target, within a factor 2)",
                    lambda v: v <= 0.02,
                    REF + ", Sec. 4 LSTM-PTB, Fig. 3(c) ('two orders of magnitude lower than the target')",
                )
            )
        if s.estimator == "tailcount (gradstat)":
            rows.append(
                Comparison(
                    f"{s.workload}, delta={s.ratio:g}, {s.estimator}: mean k_hat/k",
                    1.0,
                    "gradstat's own target on the mean (not a paper number)",
                    s["mean"],
                    tolerance=OWN_TOL,
                )
            )
    return rows


def _plot(summary: pd.DataFrame, per_step: pd.DataFrame, out: Path) -> list[str]:
    workloads = list(dict.fromkeys(summary["workload"]))
    fig, axes = new_figure(ncols=len(workloads), width=6.0, height=3.8)
    labels = list(ESTIMATORS)
    for ax, w in zip(axes[0], workloads, strict=True):
        sw = summary[summary["workload"] == w]
        ratios = sorted(sw["ratio"].unique(), reverse=True)
        width = 0.8 / len(ratios)
        for j, r in enumerate(ratios):
            s = sw[sw["ratio"] == r].set_index("estimator").reindex(labels)
            xs = np.arange(len(labels)) + j * width
            # the interval drawn on its own: a skewed k_hat/k can put the mean outside its central 90 % interval
            (mark,) = ax.plot(xs, s["mean"], "o", ms=3, label=f"delta={r:g}")
            ax.vlines(xs, s["q05"], s["q95"], color=mark.get_color(), lw=1)
        ax.axhline(1.0, color="k", lw=0.6)
        ax.axhspan(1 - SIDCO_EPS, 1 + SIDCO_EPS, color="g", alpha=0.08)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=60, ha="right", fontsize=7)
        ax.set(title=f"{w}: k_hat/k (mean, 90 % interval)")
        ax.legend(fontsize=7)
    save_figure(fig, summary, out, "sidco_quality")
    adaptive = per_step[per_step["estimator"].isin(["sidco-exp", "sidco-gamma", "sidco-gp"])]
    fig, axes = new_figure(ncols=len(workloads), width=5.0, height=3.4)
    for ax, w in zip(axes[0], workloads, strict=True):
        for (label, r), grp in adaptive[adaptive["workload"] == w].groupby(["estimator", "ratio"], sort=False):
            ax.step(grp["step"], grp["stages"], where="post", label=f"{label} {r:g}", lw=1)
        ax.set(title=f"{w}: stages M over training", xlabel="step", ylabel="M")
        ax.legend(fontsize=6, ncol=2)
    save_figure(fig, adaptive[["workload", "ratio", "estimator", "step", "stages"]], out, "sidco_stages")
    return ["sidco_quality.png", "sidco_stages.png"]


EXPERIMENT = Experiment(
    name="sidco-quality",
    title="SIDCo estimation quality over training: k_hat/k of every estimator, with error feedback in the loop",
    source="SIDCo (Abdelmoniem et al., An Efficient Statistical-based Gradient Compression Technique), Sec. 3-4, "
    "Fig. 3(c)/(f), App. E Fig. 9",
    run=run,
    quick_s=15,
    full_s=900,
    workloads=tuple(workload_names()),
)
