"""NDQSG Tables 1-2: raw and entropy-coded Kbits per worker per iteration for FC-300-100 and LeNet.

NDQSG (Abdi & Fekri, Nested Dithered Quantization for Communication Reduction), Sec. 4, Table 1 (raw bits per
worker per iteration) and Table 2 (after entropy coding, 32 workers): baseline (32-bit floats), DQSGD, QSGD,
TernGrad and one-bit. Each method's real payloads are measured on our workloads, tensor by tensor as the paper
sends them (:class:`gradstat.analysis.studies.layerwise.LayerwiseReplay`, per-layer mode), on one worker's
gradient with the paper's 256 / 32 = 8 samples per worker; beside them the closed forms of
:mod:`gradstat.theory.bits` with the paper's packing (``log2 L`` bits per code, one 32-bit scale per tensor) and
gradstat's wire format (``ceil(log2 L)`` bits per code, seeds counted). CifarNet is left out (no CIFAR-10 without
a download). Entropy coding is the zeroth-order empirical entropy of each tensor's codes (the paper's adaptive
arithmetic coder comes "within 5 %" of the entropy, Sec. 4); the paper's gradients are MNIST's, ours the digits',
so Table 2 is compared as a measurement on different data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, TypedDict

import pandas as pd

from gradstat.analysis.experiments.base import Comparison, Experiment, ExperimentResult
from gradstat.analysis.experiments.layerwise import gradients
from gradstat.analysis.plots.common import new_figure, save_figure
from gradstat.analysis.studies.layerwise import LayerwiseReplay
from gradstat.compressors import ErrorFeedback, create
from gradstat.theory import bits

SPECS = {
    "DQSGD": "dqsg:M=1",
    "QSGD": "qsgd:s=1,bucket=0",
    "TernGrad": "terngrad",
    "One-Bit": "onebit",
}
PAPER_RAW = {  # Table 1, Kbits
    "fc300": {"Baseline": 8531.5, "DQSGD": 422.8, "QSGD": 422.8, "TernGrad": 426.2, "One-Bit": 342.6},
    "lenet": {"Baseline": 53227.8, "DQSGD": 2636.7, "QSGD": 2636.7, "TernGrad": 2641.2, "One-Bit": 1897.8},
}
PAPER_ENTROPY = {  # Table 2, Kbits, 32 workers
    "fc300": {"DQSGD": 38.6, "QSGD": 38.2, "TernGrad": 48.23, "One-Bit": 330.0},
    "lenet": {"DQSGD": 299.7, "QSGD": 307.3, "TernGrad": 438.2, "One-Bit": 1889.0},
}


class Size(TypedDict):
    workloads: tuple[str, ...]
    steps: int


FULL: Size = {"workloads": ("fc300", "lenet"), "steps": 6}
QUICK: Size = {"workloads": ("fc300",), "steps": 2}
REF = "NDQSG (Abdi & Fekri), Sec. 4"
LENET_SHAPES = [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 3136), (512,), (10, 512), (10,)]


def closed_form(method: str, shapes: list[tuple[int, ...]]) -> float:
    """Bits of the paper's packing (log2 L per code, one 32-bit scale per tensor; one-bit: two per column)."""
    n, tensors = sum(int(pd.Series(s).prod()) for s in shapes), len(shapes)
    if method == "Baseline":
        return 32.0 * n
    if method == "One-Bit":
        return bits.one_bit_bits(n, bits.one_bit_columns(shapes, "matrix"))
    if method == "TernGrad":
        return bits.terngrad_bits(n, packing="ideal", partitions=tensors)
    if method == "QSGD":
        return bits.qsgd_bits(n, 1, packing="ideal", partitions=tensors)
    return bits.dqsg_bits(n, 1, partitions=tensors, packing="ideal")


def run(out: Path, quick: bool, workloads: Sequence[str] | None, seed: int, device: str = "cpu") -> ExperimentResult:
    size = QUICK if quick else FULL
    chosen = list(workloads) if workloads else list(size["workloads"])
    rows = []
    for w in chosen:
        steps = gradients(f"{w}:batch_size=8", size["steps"], seed)
        shapes = [tuple(t.shape) for t in steps[0][1].values()]
        n = sum(t.numel() for t in steps[0][1].values())
        rows.append(
            {
                "workload": w,
                "method": "Baseline",
                "params": n,
                "tensors": len(shapes),
                "paper_raw_kbits": PAPER_RAW[w]["Baseline"],
                "closed_form_kbits": closed_form("Baseline", shapes) / 1e3,
                "measured_raw_kbits": 32.0 * n / 1e3,
                "paper_entropy_kbits": float("nan"),
                "measured_entropy_kbits": float("nan"),
            }
        )
        for method, spec in SPECS.items():
            rep = LayerwiseReplay(create(spec), ErrorFeedback.none(), "per-layer")
            measured = pd.DataFrame([rep.step(step, grads, seed) for step, grads in steps])
            rows.append(
                {
                    "workload": w,
                    "method": method,
                    "params": n,
                    "tensors": len(shapes),
                    "paper_raw_kbits": PAPER_RAW[w][method],
                    "closed_form_kbits": closed_form(method, shapes) / 1e3,
                    "measured_raw_kbits": float(measured["bits"].mean()) / 1e3,
                    "paper_entropy_kbits": PAPER_ENTROPY[w][method],
                    "measured_entropy_kbits": float(measured["entropy_bits"].mean()) / 1e3,
                }
            )
    table = pd.DataFrame(rows)
    comparisons = []
    for r in table.itertuples():
        comparisons.append(
            Comparison(
                f"{r.workload} {r.method}: raw Kbits, closed form (log2 L per code, one scale per tensor)",
                r.paper_raw_kbits,
                REF + ", Table 1",
                round(r.closed_form_kbits, 1),
                tolerance=0.0,
            )
        )
        if r.method != "Baseline":
            comparisons.append(
                Comparison(
                    f"{r.workload} {r.method}: entropy-coded Kbits, measured (digits, 8 samples per worker)",
                    r.paper_entropy_kbits,
                    REF + ", Table 2 (MNIST)",
                    r.measured_entropy_kbits,
                    tolerance=0.25,
                )
            )
    notes = [
        f"{r.workload} {r.method}: paper {r.paper_raw_kbits:g} Kbits raw, closed form {r.closed_form_kbits:.2f}, "
        f"gradstat's payload {r.measured_raw_kbits:.2f} (fixed-width codes, seeds counted); entropy-coded: paper "
        f"{r.paper_entropy_kbits:g}, ours {r.measured_entropy_kbits:.2f}."
        for r in table.itertuples()
        if r.method != "Baseline"
    ]
    for w in chosen:
        t = table[table["workload"] == w].set_index("method")
        extra = (t.loc["TernGrad", "paper_raw_kbits"] - t.loc["TernGrad", "closed_form_kbits"]) * 1e3 / 32
        notes.append(
            f"{w}: the TernGrad cell exceeds n log2(3) + one scale per tensor by {extra:.0f} 32-bit floats; the paper "
            "does not say what they are (TernGrad's per-layer scalers would be one per tensor)."
        )
    if "lenet" in chosen:
        t = table[table["workload"] == "lenet"].set_index("method")
        short = (t.loc["DQSGD", "paper_raw_kbits"] - t.loc["DQSGD", "closed_form_kbits"]) * 1e3
        notes.append(
            f"lenet DQSGD: the closed form with our 8 tensors is {short:.0f} bits below the printed cell; two more "
            "32-bit scales (10 tensors) round to the printed 2636.7."
        )
        notes.append(
            "lenet One-Bit: with one column per input of each matrix view (conv (out, in kh kw)) the closed form has "
            f"{bits.one_bit_columns([tuple(s) for s in LENET_SHAPES])} columns; the printed cell implies 3,663, "
            f"which the last-dimension rule comes within one of ({bits.one_bit_columns(LENET_SHAPES, 'last')})."
        )
    notes.append(
        "gradstat's payloads use ceil(log2 3) = 2 bits per ternary code (the paper's log2 3 = 1.585 needs packing "
        "several codes per word), and DQSG sends its 64-bit seed; that is the gap between the measured raw column "
        "and the closed form. CifarNet is left out (no CIFAR-10 without a download)."
    )
    fig, axes = new_figure(ncols=2, width=5.5)
    for ax, (paper_col, ours_col, title) in zip(
        axes[0],
        (
            ("paper_raw_kbits", "closed_form_kbits", "raw Kbits (Table 1)"),
            ("paper_entropy_kbits", "measured_entropy_kbits", "entropy-coded Kbits (Table 2)"),
        ),
        strict=True,
    ):
        sub = table[table["method"] != "Baseline"]
        labels = [f"{r.workload}\n{r.method}" for r in sub.itertuples()]
        xs = range(len(sub))
        ax.bar([x - 0.2 for x in xs], sub[paper_col], width=0.4, label="paper")
        ax.bar([x + 0.2 for x in xs], sub[ours_col], width=0.4, label="ours")
        ax.set_xticks(list(xs), labels, fontsize=6)
        ax.set(yscale="log", title=title)
        ax.legend(fontsize=7)
    save_figure(fig, table, out, "ndqsg_bits")
    return ExperimentResult(
        tables={"ndqsg_bits": table},
        figures=["ndqsg_bits.png"],
        comparisons=comparisons,
        notes=notes,
        settings={"workloads": chosen, "steps": size["steps"], "samples_per_worker": 8},
    )


EXPERIMENT = Experiment(
    name="ndqsg-bits",
    title="NDQSG Tables 1-2: raw and entropy-coded Kbits per worker per iteration",
    source="NDQSG (Abdi & Fekri, Nested Dithered Quantization for Communication Reduction), Sec. 4, Tables 1-2",
    run=run,
    quick_s=5,
    full_s=40,
    workloads=("fc300", "lenet"),
)
