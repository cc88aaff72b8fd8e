"""Layer-wise vs whole-model compression: error, k_hat/k and bits of the same compressor both ways.

No paper publishes this comparison; it answers a question the papers leave to the implementer. QCS, SIDCo's
analysis and ECQ-SGD state their bounds for one vector, while GRACE (the SIDCo authors' framework) and DDP
communication hooks compress per tensor or per bucket, and NDQSG's bit tables send one scale per tensor. Each
workload trains for real (one worker, plain SGD); its gradients are replayed through
:mod:`gradstat.analysis.studies.layerwise` with error feedback, per tensor and on the flat vector. Tensors too small
for the target ratio are sent dense in the per-layer mode (as DGC does). The verdicts are the study's own numbers
(per-layer over whole-model ratios), not a paper's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, TypedDict

import pandas as pd

from gradstat.analysis.experiments.base import Experiment, ExperimentResult
from gradstat.analysis.plots.common import new_figure, save_figure
from gradstat.analysis.studies.layerwise import compare, summarize
from gradstat.analysis.training.parallel import DataParallel
from gradstat.analysis.training.workloads import get_workload, workload_names

SPECS = ("topk:ratio=0.01", "sidco:ratio=0.01,dist=exp", "tailcount:ratio=0.01", "qsgd:s=4,bucket=0")


class Size(TypedDict):
    workloads: tuple[str, ...]
    steps: int


FULL: Size = {"workloads": ("resnet20", "lstm", "lenet"), "steps": 12}
QUICK: Size = {"workloads": ("fc300",), "steps": 6}


def gradients(workload: str, steps: int, seed: int) -> list[tuple[int, dict]]:
    """The raw gradients of one worker over ``steps`` steps of plain training: ``[(step, {param: tensor})]``."""
    wl = get_workload(workload)
    model = wl.model(seed)
    loop = DataParallel(model, wl.optimizer(model), wl.loss)
    batches = wl.batches(seed)
    out = []
    for step in range(steps):
        x, y = next(batches)
        grads = loop.step(step, x, y).grads[0]
        out.append((step, {n: g.detach().clone() for n, g in grads.items()}))
    return out


def run(out: Path, quick: bool, workloads: Sequence[str] | None, seed: int, device: str = "cpu") -> ExperimentResult:
    size = QUICK if quick else FULL
    chosen = list(workloads) if workloads else list(size["workloads"])
    frames = []
    for w in chosen:
        frames.append(compare(gradients(w, size["steps"], seed), SPECS, "ef", seed).assign(workload=w))
    per_step = pd.concat(frames, ignore_index=True)
    summary = pd.concat([summarize(f).assign(workload=w) for w, f in zip(chosen, frames, strict=True)])
    wide = summary.pivot_table(
        index=["workload", "compressor"], columns="mode", values=["rel_error", "k_ratio", "bits"]
    )
    ratios = pd.DataFrame(
        {
            "rel_error_per_layer_over_whole": wide[("rel_error", "per-layer")] / wide[("rel_error", "whole")],
            "k_ratio_whole": wide[("k_ratio", "whole")],
            "k_ratio_per_layer": wide[("k_ratio", "per-layer")],
            "bits_per_layer_over_whole": wide[("bits", "per-layer")] / wide[("bits", "whole")],
        }
    ).reset_index()
    notes = [
        f"{r.workload}, {r.compressor}: per-layer error {r.rel_error_per_layer_over_whole:.3g}x the whole-model error, "
        f"bits {r.bits_per_layer_over_whole:.3g}x"
        + (
            f", k_hat/k {r.k_ratio_whole:.3g} (whole) vs {r.k_ratio_per_layer:.3g} (per layer)"
            if pd.notna(r.k_ratio_whole)
            else ""
        )
        + "."
        for r in ratios.itertuples()
    ]
    notes.append("No paper publishes these numbers; the table has no paper column to compare against.")
    fig, axes = new_figure(ncols=2, width=5.5)
    for ax, col, title in (
        (axes[0][0], "rel_error_per_layer_over_whole", "error: per-layer / whole"),
        (axes[0][1], "bits_per_layer_over_whole", "bits: per-layer / whole"),
    ):
        for w, grp in ratios.groupby("workload", sort=False):
            ax.plot(grp["compressor"], grp[col], "o", label=w)
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set(title=title)
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.legend(fontsize=7)
    save_figure(fig, ratios, out, "layerwise")
    return ExperimentResult(
        tables={"layerwise_summary": summary, "layerwise_ratios": ratios, "layerwise_steps": per_step},
        figures=["layerwise.png"],
        comparisons=[],
        notes=notes,
        settings={"workloads": chosen, "steps": size["steps"], "feedback": "ef", "compressors": list(SPECS)},
    )


EXPERIMENT = Experiment(
    name="layerwise",
    title="Layer-wise vs whole-model compression: error, k_hat/k and bits of the same compressor",
    source="no paper (GRACE and DDP hooks compress per tensor; the papers' analyses treat one vector)",
    run=run,
    quick_s=8,
    full_s=120,
    workloads=tuple(workload_names()),
)
