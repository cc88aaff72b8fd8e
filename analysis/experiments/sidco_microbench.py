"""SIDCo micro-benchmark: compression time and speed-up over Top-k of every sparsifier vs vector size, per ratio.

SIDCo (Abdelmoniem et al., An Efficient Statistical-based Gradient Compression Technique), Sec. 1 Fig. 1 (speed-ups
over Top-k at delta in {0.1, 0.01, 0.001}, (a) GPU, (b) CPU), App. E.2 (Fig. 14-15, real models) and App. E.3
(Fig. 16: speed-up over Top-k, Fig. 17: compression latency, of synthetic vectors of 0.26, 2.6, 26 and 260 million
elements, panels (a)-(d) GPU, (e)-(h) CPU), measured on a Tesla V100 and a 16-core Xeon Silver 4112 with PyTorch
1.1 (App. D). The text we have carries the figures' captions only, no values read off their bars, so the published
side is what the text states: threshold methods "impose consistently lower compression overhead compared to Top-k
and DGC on both GPU and CPU" (Sec. 1); "On the CPU ... DGC is the slowest method and Top-k excels over it" (App.
E.3); "On a GPU, SIDCo improves over DGC by at least 2x, and the speed-ups are significantly larger on the CPU"
(Sec. 4, Takeaways); Top-k on a CPU costs O(d log2 k) (Sec. 1) against the threshold methods' few linear passes,
so at a fixed delta their speed-up should grow with d.

The table is :func:`gradstat.analysis.bench.microbench.run` (``gradstat bench microbench``, whose own page with
the speed goals, the machine's load and its figure is written to ``bench/`` of the output), called here with its
default sizes (plus 260M, skipped with a row saying so where the memory check refuses it), ratios and thread
counts; this module only selects the paper's methods from it, draws the paper's two figures as lines over the size
(speed-up over ``torch.topk`` and encode time, one panel per ratio, one row per thread count or device) and turns
the statements above into comparison rows. The claims about sizes are judged on every measured size above the
smallest (2.6M and up at full size). SIDCo runs with M = 3 fixed stages (the adaptive M needs a training history);
the paper's names: SIDCo-E = ``exp``, SIDCo-GP (gamma first stage, then generalized Pareto) = ``gamma``, SIDCo-P
(generalized Pareto at every stage) = ``gp`` (App. F).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Sequence, TypedDict

import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from gradstat.analysis.bench import microbench
from gradstat.analysis.bench.timing import REWARM_MS
from gradstat.analysis.experiments.base import Comparison, Experiment, ExperimentResult
from gradstat.analysis.plots.common import legend_outside, log_axis, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes

BASELINE = "torch.topk(|g|)"
PAPER_METHODS: dict[str, str] = {
    "dgc": "DGC",
    "redsync": "RedSync",
    "gaussianksgd": "GaussianKSGD",
    "sidco:dist=exp,stages=3": "SIDCo-E (exp, M=3)",
    "sidco:dist=gamma,stages=3": "SIDCo-GP (gamma, M=3)",
    "sidco:dist=gp,stages=3": "SIDCo-P (gp, M=3)",
}
"""bench spec -> label of the methods the paper's micro-benchmark shows (Top-k is the baseline)."""
OWN_METHODS: dict[str, str] = {"tailcount": "tailcount (gradstat)", "topk": "topk (gradstat, packed)"}
"""gradstat's own rows drawn beside the paper's: its count-corrected threshold and its Top-k compressor."""
THRESHOLD_METHODS: tuple[str, ...] = (
    "redsync",
    "gaussianksgd",
    "sidco:dist=exp,stages=3",
    "sidco:dist=gamma,stages=3",
    "sidco:dist=gp,stages=3",
)
"""The methods that estimate a threshold (the paper's "threshold estimation methods", App. E.3)."""
SIDCO_E = "sidco:dist=exp,stages=3"
REF = "SIDCo (Abdelmoniem et al.)"
PAPER_DGC_FACTOR = 2.0
"""Sec. 4, Takeaways: 'On a GPU, SIDCo improves over DGC by at least 2x' (and more on the CPU)."""


class Size(TypedDict):
    sizes: tuple[int, ...]
    ratios: tuple[float, ...]
    threads: tuple[int, ...]
    repeats: int


FULL: Size = {
    "sizes": (260_000, 2_600_000, 26_000_000, 260_000_000),
    "ratios": (0.1, 0.01, 0.001),
    "threads": (1, 0),
    "repeats": 5,
}
QUICK: Size = {"sizes": (2_600, 26_000), "ratios": (0.1, 0.01, 0.001), "threads": (1, 0), "repeats": 3}


def speedup_table(bench: pd.DataFrame) -> pd.DataFrame:
    """The paper's methods (and gradstat's own) from the bench table, each row beside its ``torch.topk`` time: the
    bench's ``topk_ms``, torch.topk's calls of the same size, thread count and ratio interleaved with that row's
    (:func:`~gradstat.analysis.bench.timing.time_paired`), or where a table lacks that column the ``torch.topk(|g|)``
    row's own time; ``speedup = topk_ms / ms``, as the bench's ``speedup_vs_topk``."""
    sparse = bench[bench["group"] == "sparsifier"]
    keys = ["size", "threads", "ratio"]
    base = sparse[sparse["name"] == BASELINE][keys + ["ms"]].rename(columns={"ms": "topk_ms"})
    labels = {**PAPER_METHODS, **OWN_METHODS}
    own = ["topk_ms"] if "topk_ms" in sparse.columns else []
    rows = sparse[sparse["name"].isin(list(labels))][keys + ["name", "ms", "ms_min", "ms_max", *own]]
    if own:
        table = rows.merge(base.rename(columns={"topk_ms": "topk_row_ms"}), on=keys, how="left", validate="many_to_one")
        table["topk_ms"] = table["topk_ms"].fillna(table.pop("topk_row_ms"))
    else:
        table = rows.merge(base, on=keys, how="left", validate="many_to_one")
    table.insert(4, "method", table["name"].map(labels))
    table["speedup"] = table["topk_ms"] / table["ms"]
    table["paper_method"] = table["name"].isin(list(PAPER_METHODS))
    return table.sort_values(
        ["threads", "ratio", "name", "size"], ascending=[True, False, True, True], ignore_index=True
    )


def _edge(values: pd.Series, edge: str) -> float:
    """The least or the largest of ``values`` (NaN when there are none)."""
    if not len(values):
        return math.nan
    return float(values.min() if edge == "least" else values.max())


def _setting(threads: str) -> str:
    return "GPU" if threads == "cuda" else f"CPU, threads {threads}"


def compare(table: pd.DataFrame) -> list[Comparison]:
    """The paper's statements about its micro-benchmark as rows, per thread count (or device), from ``table``."""
    rows: list[Comparison] = []
    for threads, t in table.groupby("threads", sort=False):
        where = _setting(str(threads))
        gpu = threads == "cuda"
        sizes = sorted(t["size"].unique())
        large = t[t["size"] > sizes[0]] if len(sizes) > 1 else t.iloc[0:0]
        span = f"sizes >= {min(large['size'], default=math.nan):,}" if len(large) else "sizes above the smallest"
        fig = "Fig. 16(a)-(d)" if gpu else "Fig. 16(e)-(h)"
        for name in THRESHOLD_METHODS:
            s = large[large["name"] == name]["speedup"]
            rows.append(
                Comparison(
                    f"{where}: {PAPER_METHODS[name]} speed-up over Top-k, least over {span} and every ratio",
                    1.0,
                    f"{REF}, Sec. 1 Fig. 1 and App. E.3 {fig} ('consistently lower compression overhead compared to "
                    "Top-k'): > 1",
                    _edge(s, "least"),
                    kind="at_least",
                )
            )
        dgc = t[t["name"] == "dgc"]["speedup"]
        # the paper's DGC claim differs by device: faster than Top-k on the GPU, slower on the CPU
        edge = "least" if gpu else "largest"
        kind: Literal["at_least", "at_most"] = "at_least" if gpu else "at_most"
        quote = (
            "App. E.2-E.3 ('DGC outperforms Top-k on the GPU device')"
            if gpu
            else f"App. E.3 {fig} ('On the CPU ... DGC is the slowest method and Top-k excels over it')"
        )
        rows.append(
            Comparison(
                f"{where}: DGC speed-up over Top-k, {edge} over every size and ratio",
                1.0,
                f"{REF}, {quote}",
                _edge(dgc, edge),
                kind=kind,
            )
        )
        if not gpu:
            rows.append(
                Comparison(
                    f"{where}: share of (size, ratio) cells where DGC is the slowest of the paper's methods and Top-k",
                    1.0,
                    f"{REF}, App. E.3 {fig} ('DGC is the slowest method')",
                    _dgc_slowest_share(t),
                    kind="at_least",
                )
            )
        rows.append(
            Comparison(
                f"{where}: SIDCo-E over DGC (SIDCo-E speed-up / DGC speed-up), least over every size and ratio",
                PAPER_DGC_FACTOR,
                f"{REF}, Sec. 4 Takeaways ('On a GPU, SIDCo improves over DGC by at least 2x, and the speed-ups are "
                "significantly larger on the CPU')",
                _least_ratio(t, "dgc", SIDCO_E),
                kind="at_least",
            )
        )
        rows.append(
            Comparison(
                f"{where}: SIDCo-E speed-up at the largest / the smallest size, least over the ratios",
                1.0,
                f"{REF}, Sec. 1 (Top-k is O(d log2 k) on a CPU, the threshold methods linear): the speed-up grows with "
                "d (implied, not printed)",
                _growth(t, SIDCO_E),
                kind="at_least",
            )
        )
    return rows


def _dgc_slowest_share(t: pd.DataFrame) -> float:
    """Share of (size, ratio) cells in which DGC takes longer than torch.topk and every other paper method."""
    cells = []
    for _, grp in t[t["paper_method"]].groupby(["size", "ratio"]):
        dgc = grp.loc[grp["name"] == "dgc", "speedup"]
        if len(dgc):  # (by speed-ups: each method against the torch.topk calls timed beside its own)
            cells.append(bool(dgc.iloc[0] <= grp["speedup"].min() and dgc.iloc[0] < 1.0))
    return float(np.mean(cells)) if cells else math.nan


def _least_ratio(t: pd.DataFrame, slow: str, fast: str) -> float:
    """min over (size, ratio) of speedup(fast) / speedup(slow): ms(slow) / ms(fast) where both share one Top-k time,
    and where each was timed beside Top-k calls of its own, the ratio of two ratios each taken in one stretch."""
    a = t[t["name"] == fast].set_index(["size", "ratio"])["speedup"]
    b = t[t["name"] == slow].set_index(["size", "ratio"])["speedup"]
    r = (a / b).dropna()
    return float(r.min()) if len(r) else math.nan


def _growth(t: pd.DataFrame, name: str) -> float:
    """min over ratios of speedup(largest size) / speedup(smallest size) of ``name``."""
    s = t[t["name"] == name]
    if s["size"].nunique() < 2:
        return math.nan
    lo, hi = s["size"].min(), s["size"].max()
    by = s.set_index(["ratio", "size"])["speedup"]
    ratios = sorted(s["ratio"].unique())
    return float(min(by[(r, hi)] / by[(r, lo)] for r in ratios))


def _load(bench: pd.DataFrame) -> str:
    """The machine's load when the bench started, as the bench measured it (``unknown`` for a table without it)."""
    load = bench.attrs.get("load")
    return f"{load[0]:.2f}" if load else "unknown"


def notes(table: pd.DataFrame, bench: pd.DataFrame, device: str) -> list[str]:
    """Sentences generated from the numbers: SIDCo-E's speed-up per size, skipped sizes, where we measured."""
    out = [
        "The paper measured on a Tesla V100 GPU and a 16-core Xeon Silver 4112 CPU with PyTorch 1.1 (App. D); here "
        + (
            "a CUDA device"
            if device == "cuda"
            else f"this machine's CPU ({bench.attrs.get('cores', 'unknown')} cores, 1-minute load average "
            f"{_load(bench)} when the "
            "bench started; medians of repeated calls)"
        )
        + ": absolute times differ, so compare the trends (speed-up > 1 and growing with size), not the values.",
        "The paper's figures carry no printed values in the text we have; its side of the table is its stated claims.",
    ]
    if "topk_ms" in bench.columns:
        out.append(
            "Each method's Top-k time is torch.topk's median over calls interleaved with that method's own (column "
            f"topk_ms; a call under {REWARM_MS:g} ms timed right after an untimed call of the same function): both "
            "sides of a speed-up are timed in the same stretch of the run."
        )
    for _, row in bench[bench["group"] == "skipped"].iterrows():
        out.append(f"Size {int(row['size']):,} not measured with threads {row['threads']}: {row['name']}.")
    e = table[table["name"] == SIDCO_E]
    for threads, et in e.groupby("threads", sort=False):
        faster = int((et["speedup"] > 1).sum())
        grows = sum(
            bool(grp.sort_values("size")["speedup"].diff().dropna().gt(0).all()) for _, grp in et.groupby("ratio")
        )
        out.append(
            f"Trend, {_setting(str(threads))}: SIDCo-E is faster than Top-k in {faster} of {len(et)} (size, ratio) "
            f"cells, and its speed-up grows with every size step at {grows} of {et['ratio'].nunique()} ratios."
        )
        for ratio, grp in et.groupby("ratio", sort=False):
            cells = ", ".join(
                f"{_short(int(r['size']))}: {r['speedup']:.2f}x" for _, r in grp.sort_values("size").iterrows()
            )
            out.append(f"SIDCo-E speed-up over Top-k, {_setting(str(threads))}, delta = {ratio:g}: {cells}.")
    return out


def _short(n: int) -> str:
    """0.26M, 26k, 600: a vector length as the paper writes it."""
    return f"{n / 1e6:g}M" if n >= 1e5 else (f"{n / 1e3:g}k" if n >= 1e3 else str(n))


def _plottable(sub: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows of ``sub`` a log axis can show: ``column`` (and, for times, the Top-k time) finite and > 0. A
    timing can be 0 or absent (a clock's resolution above a GPU kernel's time, a method that did not run)."""
    columns = [column, "topk_ms"] if column == "ms" else [column]
    values = sub[columns].astype(float)
    return sub[(np.isfinite(values) & (values > 0)).all(axis=1)]


def _plot_cell(ax: Axes, sub: pd.DataFrame, column: str) -> bool:
    """One panel of ``column`` (speed-up or time) against size; False when no row of it can be drawn."""
    shown = _plottable(sub, column)
    for name, grp in shown.groupby("name", sort=False):
        grp = grp.sort_values("size")
        style = "-o" if name in PAPER_METHODS else "--s"
        if column == "ms":
            low = (grp["ms"] - grp["ms_min"]).clip(lower=0).fillna(0)
            high = (grp["ms_max"] - grp["ms"]).clip(lower=0).fillna(0)
            ax.errorbar(
                grp["size"].to_numpy(),
                grp["ms"].to_numpy(),
                yerr=[low.to_numpy(), high.to_numpy()],
                fmt=style,
                ms=3,
                lw=1,
                capsize=2,
                label=grp["method"].iloc[0],
            )
        else:
            ax.plot(grp["size"].to_numpy(), grp["speedup"].to_numpy(), style, ms=3, lw=1, label=grp["method"].iloc[0])
    if shown.empty:
        return False
    if column == "ms":
        base = shown.groupby("size")["topk_ms"].median().sort_index()  # (each row's own baseline: their median)
        ax.plot(base.index.to_numpy(), base.to_numpy(), "k-", lw=2.5, label="Top-k (torch.topk)")
    else:
        ax.axhline(1.0, color="k", lw=1.5, label="Top-k (torch.topk)")
    return True


def _plot(table: pd.DataFrame, out: Path) -> list[str]:
    """The speed-up and time figures, one panel per thread setting and ratio. A panel without a positive finite
    value says how many of its rows could not be drawn (linear axes) instead of failing the log scale; no figure
    when the table has no row at all."""
    settings = list(dict.fromkeys(table["threads"]))
    ratios = sorted(table["ratio"].unique(), reverse=True)
    if not settings or not ratios:
        return []
    figures = []
    for stem, column, ylabel in (
        ("sidco_microbench_speedup", "speedup", "speed-up over torch.topk (median)"),
        ("sidco_microbench_time", "ms", "encode time, ms (median, min-max)"),
    ):
        fig, axes = new_figure(ncols=len(ratios), nrows=len(settings), width=4.2, height=3.2)
        for i, threads in enumerate(settings):
            for j, ratio in enumerate(ratios):
                ax = axes[i, j]
                sub = table[(table["threads"] == threads) & (table["ratio"] == ratio)]
                ax.set(xlabel="elements d", title=f"delta = {ratio:g}, {_setting(threads)}")
                if j == 0:
                    ax.set_ylabel(ylabel)
                if not _plot_cell(ax, sub, column):
                    ax.text(
                        0.5,
                        0.5,
                        f"no positive finite {column} in {len(sub)} rows",
                        ha="center",
                        va="center",
                        transform=ax.transAxes,
                    )
                    continue
                ax.set(xscale="log", yscale="log")
                sizes = sorted(_plottable(sub, column)["size"].unique())
                ax.set_xticks(sizes, [_short(n) for n in sizes])
                ax.xaxis.set_minor_formatter(NullFormatter())
                log_axis(ax.yaxis)
            drawn = [a for a in axes[i] if a.get_legend_handles_labels()[0]]
            if drawn:
                legend_outside(axes[i, -1], source=drawn[-1])
        save_figure(fig, table, out, stem)
        figures.append(f"{stem}.png")
    return figures


def run(out: Path, quick: bool, workloads: Sequence[str] | None, seed: int, device: str = "cpu") -> ExperimentResult:
    size = QUICK if quick else FULL
    bench = microbench.run(
        sizes=size["sizes"],
        ratios=size["ratios"],
        threads=size["threads"],
        repeats=size["repeats"],
        device=device,
        seed=seed,
        out=str(out / "bench"),  # the bench's own page: its goals, the machine's load, its figure
    )
    table = speedup_table(bench)
    return ExperimentResult(
        tables={"bench": bench, "speedup": table},
        figures=_plot(table, out),
        comparisons=compare(table),
        notes=notes(table, bench, device),
        settings={
            "sizes": list(size["sizes"]),
            "ratios": list(size["ratios"]),
            "threads": "cuda" if device == "cuda" else list(size["threads"]),
            "repeats": size["repeats"],
            "device": device,
        },
    )


EXPERIMENT = Experiment(
    name="sidco-microbench",
    title="SIDCo micro-benchmark: speed-up over Top-k and compression time vs vector size",
    source="SIDCo (Abdelmoniem et al., An Efficient Statistical-based Gradient Compression Technique), Sec. 1 Fig. 1, "
    "Sec. 4 Takeaways, App. E.3 Fig. 16-17",
    run=run,
    quick_s=10,
    full_s=600,  # 0.26M + 2.6M at one thread took 26 s of CPU time here; 26M ~10x that; two thread counts
    devices=("cpu", "cuda"),
)
