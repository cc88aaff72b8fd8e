"""QCS Fig. 4: relative quantization error of unbiased QCS and QSGD during training, with 1-sigma bands.

QCS (Abdi & Fekri, Quantized Compressive Sampling of Stochastic Gradients), Sec. 6 "Quantizer Evaluation" and
Fig. 4: ||g - g~||^2 / ||g||^2 during training of LeNet on MNIST for unbiased QCS and QSG at several compression
gains, shaded 1-sigma; the text: the results confirm Thm. 2 (E||g - g~||^2 <= gamma ||g||^2, gamma of eq. (10)) and
"unlike QSG, the relative quantization error of QCS is highly concentrated around the mean value". The figure's
values are not printed, so the rows compare Thm. 2's bound (a number per setting) and the concentration claim,
measured as the coefficient of variation (sd / mean) of the error over draws and steps.

Here LeNet is the project's digits LeNet (NDQSG's architecture on scikit-learn's digits at 28x28), trained with
plain SGD; at every ``every``-th step the gradient is compressed ``draws`` times with independent seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, TypedDict

import numpy as np
import pandas as pd
import torch

from gradstat.analysis.experiments.base import Comparison, Experiment, ExperimentResult
from gradstat.analysis.experiments.layerwise import gradients
from gradstat.analysis.plots.common import new_figure, save_figure
from gradstat.compressors import Context, create
from gradstat.compressors.schemes.quantizers.qcs import QCS, variance_factor

METHODS = {
    "qcs gain 28": "qcs:block=256,k=64,Q=4",
    "qcs gain 64": "qcs:block=256,k=32,Q=2",
    "qsgd s=4": "qsgd:s=4,bucket=512",
    "qsgd s=1": "qsgd:s=1,bucket=512",
}


class Size(TypedDict):
    workload: str
    steps: int
    every: int
    draws: int


FULL: Size = {"workload": "lenet", "steps": 60, "every": 5, "draws": 3}
QUICK: Size = {"workload": "fc300", "steps": 4, "every": 2, "draws": 2}
REF = "QCS (Abdi & Fekri), Sec. 6 Quantizer Evaluation, Fig. 4"


def run(out: Path, quick: bool, workloads: Sequence[str] | None, seed: int, device: str = "cpu") -> ExperimentResult:
    size = QUICK if quick else FULL
    workload = workloads[0] if workloads else size["workload"]
    comps = {label: create(spec) for label, spec in METHODS.items()}
    rows = []
    for step, grads in gradients(workload, size["steps"], seed):
        if step % size["every"]:
            continue
        g = torch.cat([t.reshape(-1) for t in grads.values()])
        gg = float(g.double().square().sum())
        for label, comp in comps.items():
            for draw in range(size["draws"]):
                ctx = Context(seed=seed + 7919 * draw, step=step)
                p = comp.encode(g, ctx)
                err = float((comp.decode(p, ctx).double() - g.double()).square().sum()) / gg
                rows.append({"method": label, "step": step, "draw": draw, "rel_error": err, "gain": p.gain})
    per = pd.DataFrame(rows)
    summary = []
    for label, grp in per.groupby("method", sort=False):
        within = grp.groupby("step")["rel_error"]
        spec = comps[label]
        bound = variance_factor(spec.block, spec.k, spec.Q) if spec.name == "qcs" and isinstance(spec, QCS) else np.nan
        summary.append(
            {
                "method": label,
                "gain": float(grp["gain"].mean()),
                "mean": float(grp["rel_error"].mean()),
                "sd": float(grp["rel_error"].std(ddof=1)),
                "cv": float(grp["rel_error"].std(ddof=1) / grp["rel_error"].mean()),
                "cv_within_step": float((within.std(ddof=1) / within.mean()).mean()),
                "gamma_bound": bound,
            }
        )
    summary = pd.DataFrame(summary)
    s = summary.set_index("method")
    comparisons = [
        Comparison(
            f"{label}: mean relative error <= gamma (eq. (10))",
            float(s.loc[label, "gamma_bound"]),
            "QCS (Abdi & Fekri), Thm. 2, eq. (10)",
            float(s.loc[label, "mean"]),
            kind="at_most",
        )
        for label in METHODS
        if label.startswith("qcs")
    ]
    cv_qcs = float(s[s.index.str.startswith("qcs")]["cv"].max())
    cv_qsgd = float(s[s.index.str.startswith("qsgd")]["cv"].min())
    comparisons.append(
        Comparison(
            "QCS's error is more concentrated than QSGD's: largest QCS sd/mean < smallest QSGD sd/mean (1 = yes)",
            1.0,
            REF,
            float(cv_qcs < cv_qsgd),
            kind="claim",
            paper_text="unlike QSG, the relative quantization error of QCS is highly concentrated around the mean",
        )
    )
    notes = [
        f"{r.method}: gain {r.gain:.1f}, relative error {r['mean']:.4g} +- {r.sd:.3g} (sd/mean {r.cv:.3g}; within a "
        f"step, over draws: {r.cv_within_step:.3g})"
        + (f", Thm. 2 bound {r.gamma_bound:.4g}" if np.isfinite(r.gamma_bound) else "")
        + "."
        for _, r in summary.iterrows()
    ]
    notes.append(f"workload {workload} (the project's digits LeNet in the full size; MNIST in the paper).")
    fig, axes = new_figure(width=6.0)
    ax = axes[0][0]
    for label, grp in per.groupby("method", sort=False):
        m = grp.groupby("step")["rel_error"].agg(["mean", "std"])
        steps, mean, sd = m.index.to_numpy(), m["mean"].to_numpy(), m["std"].to_numpy()  # matplotlib 3.7: arrays
        (line,) = ax.plot(steps, mean, label=label)
        ax.fill_between(steps, mean - sd, mean + sd, color=line.get_color(), alpha=0.2)
    ax.set(
        yscale="log", xlabel="training step", ylabel="||g - g~||^2 / ||g||^2", title=f"{workload}: +-1 sd over draws"
    )
    ax.legend(fontsize=7)
    save_figure(fig, per, out, "qcs_fig4")
    return ExperimentResult(
        tables={"qcs_fig4_summary": summary, "qcs_fig4_steps": per},
        figures=["qcs_fig4.png"],
        comparisons=comparisons,
        notes=notes,
        settings={"workload": workload, **{k: v for k, v in size.items() if k != "workload"}},
    )


EXPERIMENT = Experiment(
    name="qcs-fig4",
    title="QCS Fig. 4: relative quantization error of unbiased QCS vs QSGD during training",
    source="QCS (Abdi & Fekri, Quantized Compressive Sampling of Stochastic Gradients), Sec. 6, Fig. 4 and Thm. 2",
    run=run,
    quick_s=5,
    full_s=120,
    workloads=("lenet", "fc300", "logreg", "resnet20", "lstm"),
)
