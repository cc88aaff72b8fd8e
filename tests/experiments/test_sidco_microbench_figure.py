"""The micro-benchmark's figures draw whatever was measured: rows whose time is 0 (a clock coarser than a GPU
kernel), NaN or absent leave their panel without a log scale and say so, instead of failing the whole experiment
("Data cannot be log-scaled because all values are <= 0", seen with ``--device cuda``)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from gradstat.analysis.experiments import sidco_microbench as mb

SIZES, RATIOS = (2_600, 26_000), (0.1, 0.01)


def table(ms: float, topk_ms: float, threads: str = "cuda") -> pd.DataFrame:
    """A speed-up table in :func:`mb.speedup_table`'s layout, every time set to ``ms`` and Top-k's to ``topk_ms``."""
    names = list(mb.PAPER_METHODS)[:2] + list(mb.OWN_METHODS)[:1]
    rows = [
        {"size": size, "threads": threads, "ratio": ratio, "name": name, "ms": ms, "ms_min": ms, "ms_max": ms}
        for size, ratio, name in itertools.product(SIZES, RATIOS, names)
    ]
    t = pd.DataFrame(rows)
    t["topk_ms"] = topk_ms
    t.insert(4, "method", t["name"].map({**mb.PAPER_METHODS, **mb.OWN_METHODS}))
    with np.errstate(divide="ignore", invalid="ignore"):
        t["speedup"] = t["topk_ms"] / t["ms"]
    t["paper_method"] = t["name"].isin(list(mb.PAPER_METHODS))
    return t


def drawn(out, figures) -> list[str]:
    for name in figures:
        with Image.open(out / name) as image:
            assert image.size[0] > 100 and image.size[1] > 100
    return figures


@pytest.mark.parametrize(
    ("ms", "topk_ms"),
    [(0.0, 0.0), (np.nan, np.nan), (0.0, 1.0), (1.0, 0.0)],
    ids=["all-zero", "all-nan", "zero-times", "zero-topk"],
)
def test_rows_without_a_positive_time_still_draw_both_figures(tmp_path, ms, topk_ms):
    figures = drawn(tmp_path, mb._plot(table(ms, topk_ms), tmp_path))
    assert figures == ["sidco_microbench_speedup.png", "sidco_microbench_time.png"]


def test_a_panel_with_measured_rows_keeps_its_log_axes_beside_an_empty_one(tmp_path, monkeypatch):
    t = table(2.0, 4.0)
    t.loc[t["ratio"] == 0.01, ["ms", "ms_min", "ms_max", "speedup"]] = [0.0, 0.0, 0.0, np.inf]
    scales = []
    original = mb._plot_cell

    def recording(ax, sub, column):
        shown = original(ax, sub, column)
        scales.append((float(sub["ratio"].iloc[0]), column, shown))
        return shown

    monkeypatch.setattr(mb, "_plot_cell", recording)
    drawn(tmp_path, mb._plot(t, tmp_path))
    assert sorted(scales) == [(0.01, "ms", False), (0.01, "speedup", False), (0.1, "ms", True), (0.1, "speedup", True)]


def test_a_ratio_absent_from_one_thread_setting_leaves_that_panel_empty(tmp_path):
    t = pd.concat([table(2.0, 4.0, "1"), table(2.0, 4.0, "cuda").query("ratio == 0.1")], ignore_index=True)
    assert drawn(tmp_path, mb._plot(t, tmp_path)) == ["sidco_microbench_speedup.png", "sidco_microbench_time.png"]


def test_an_empty_table_draws_no_figure(tmp_path):
    assert mb._plot(table(1.0, 1.0).iloc[:0], tmp_path) == []
