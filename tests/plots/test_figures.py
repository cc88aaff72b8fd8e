"""Figures: each bound drawn only where it is valid, legends outside the data, integer step ticks, one marker
shape per family."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest


@pytest.fixture(scope="module")
def summaries() -> dict[str, pd.DataFrame]:
    from gradstat.analysis.measure.sources import GradientSource
    from gradstat.analysis.studies.feedback import feedback_table

    seq = [[GradientSource().vector(256, index=t)] for t in range(2)]
    out = {}
    for kind, spec in (("unbiased", "qcs:block=256,k=64,Q=4"), ("mmse", "qcs:block=256,k=64,Q=4,alpha=mmse")):
        out[kind], _ = feedback_table(spec, [0.3, 1.0], seq, [0, 1])
    return out


@pytest.fixture
def captured(monkeypatch):
    """The figures handed to ``save_figure`` by the plot modules (drawn, not written)."""
    figs = []

    def keep(fig, data, out_dir, stem):
        fig.canvas.draw()
        figs.append(fig)
        return {}

    import gradstat.analysis.plots.feedback as fb
    import gradstat.analysis.plots.fits as fits

    monkeypatch.setattr(fb, "save_figure", keep)
    monkeypatch.setattr(fits, "save_figure", keep)
    return figs


def test_each_bound_is_drawn_only_where_it_is_valid(summaries):
    from gradstat.analysis.studies.feedback import eta_curve

    u, m = eta_curve(summaries["unbiased"]), eta_curve(summaries["mmse"])
    gamma = float(summaries["unbiased"]["gamma"].iloc[0])
    assert set(u["bound"]) == {"eta"} and u["beta"].max() < min(1.0, 2 / (1 + gamma))  # (15)'s range
    assert np.isfinite(m["value"]).all()
    k = m[m["bound"] == "karimireddy"]
    assert list(k["beta"]) == [1.0]  # Remark 3 is stated for beta = 1
    mink = m[m["bound"] == "eta_minkowski"]
    assert mink["beta"].min() <= 0.01 and mink["beta"].max() == 1.0
    printed = m[m["bound"] == "eta"]
    assert printed["beta"].min() > 0.3  # (16) as printed has no bound for small beta at this gamma


def test_eta_figure_draws_eta_minkowski_and_puts_the_legend_outside(summaries, captured, tmp_path):
    from gradstat.analysis.plots.feedback import eta_vs_beta
    from gradstat.analysis.studies.feedback import eta_curve

    eta_vs_beta(summaries["mmse"], eta_curve(summaries["mmse"]), tmp_path, "x")
    ax = captured[-1].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("eta_minkowski" in s for s in labels) and any("Karimireddy" in s for s in labels)
    legend_box = ax.get_legend().get_window_extent()
    assert legend_box.x0 >= ax.get_window_extent().x1  # right of the axes: never over the data


def test_drift_has_integer_step_ticks_and_one_shape_per_family(captured, tmp_path):
    from gradstat.analysis.plots.fits import MARKERS, drift

    data = pd.DataFrame(
        [
            {"step": s, "family": f, "scale": 1.0 + s, "shape": None if f == "exponential" else 0.5}
            for s in (0, 5, 10)
            for f in ("exponential", "gamma", "genpareto")
        ]
    )
    drift(data, tmp_path, "d")
    fig = captured[-1]
    for ax in fig.axes[:2]:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(math.isclose(t, round(t)) for t in ticks)
    shapes = {line.get_label(): line.get_marker() for line in fig.axes[0].get_lines()}
    assert shapes == MARKERS and len(set(shapes.values())) == 3
