"""The analysis commands on a tiny dump: files written and the numbers in them, exit statuses, error messages."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gradstat.analysis.cli.main import main
from gradstat.analysis.measure.sources import law_label


def run(*args: str) -> int:
    return main([*map(str, args)])


def test_fit_writes_fits_for_every_family_step_and_scope(tiny_dump, tmp_path):
    out = tmp_path / "fit"
    assert run("fit", tiny_dump, "--out", out, "--steps", "0-1", "--workers", "0", "--layers", "fc3.*", "--quiet") == 0
    df = pd.read_csv(out / "fits.csv")
    model = df[df["scope"] == "model"]
    assert len(model) == 2 * 3 * 2  # steps x families x methods
    from gradstat.analysis.dumps import open_dump

    assert set(df["scope"]) - {"model"} == {p for p in open_dump(tiny_dump).params if p.startswith("fc3.")}
    assert model["ks"].between(0, 1).all() and model["zero_fraction"].between(0, 1).all()
    assert [sorted(ranks) for _, ranks in model.groupby(["step", "method"])["aic_rank"]] == [[1, 2, 3]] * 4
    assert model["tail_0.1"].between(0.3, 3).all()  # a fitted 90 % quantile cannot be wildly off on 266k values
    for name in ("fit_pdf_cdf", "fit_qq", "fit_tail_check", "fit_drift"):
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.csv").exists()


def test_fit_compensated_and_normalized(tiny_dump, tmp_path):
    out = tmp_path / "fitc"
    assert (
        run(
            "fit",
            tiny_dump,
            "--out",
            out,
            "--scope",
            "model",
            "--method",
            "closed_form",
            "--compensated",
            "--normalize",
            "--steps",
            "2",
            "--workers",
            "1",
            "--quiet",
        )
        == 0
    )
    df = pd.read_csv(out / "fits.csv")
    assert set(df["variant"]) == {"compensated, l2-normalised"}
    assert df["scale"].max() < 1  # |g|/||g|| of 266k values


def test_threshold_summary_has_topk_exact_and_binomial_band(tiny_dump, tmp_path):
    out = tmp_path / "thr"
    assert (
        run(
            "threshold",
            tiny_dump,
            "--out",
            out,
            "--ratio",
            "0.01,0.001",
            "--estimators",
            "topk,dgc,sidco-exp-M2",
            "--quiet",
        )
        == 0
    )
    s = pd.read_csv(out / "threshold_summary.csv")
    topk = s[s["estimator"] == "topk"]
    assert (topk["mean"] == 1.0).all() and (topk["inside_band"] == 1.0).all()
    assert (s["band_low"] < 1).all() and (s["band_high"] > 1).all()
    steps = pd.read_csv(out / "threshold_steps.csv")
    assert len(steps) == 3 * 3 * 2 and (steps["k_hat"] == (steps["k_ratio"] * steps["k"]).round()).all()
    assert (out / "threshold_k_ratio.png").exists()


def test_compress_replays_with_feedback_and_counts_bits(tiny_dump, tmp_path):
    out = tmp_path / "cmp"
    assert (
        run(
            "compress",
            tiny_dump,
            "--out",
            out,
            "--compressor",
            "topk:ratio=0.01",
            "--feedback",
            "ef",
            "--seeds",
            "2",
            "--quiet",
        )
        == 0
    )
    df = pd.read_csv(out / "compress_steps.csv")
    assert len(df) == 3 * 2
    assert (df["k_ratio"] == 1.0).all()
    d = int(df["d"].iloc[0])
    k = math.ceil(0.01 * d)
    assert (df["bits"] == k * (math.ceil(math.log2(d)) + 32)).all()
    assert df["gain"].iloc[0] == pytest.approx(32 * d / df["bits"].iloc[0])
    assert (df["bias"] == -df["rel_error"]).all()  # exact values kept: <C(z) - z, z> = -||C(z) - z||^2
    first = df[df["step"] == 0]
    assert (first["residual_rel"] == first["rel_error"]).all()  # r_1 = z_0 - C(z_0) with z_0 = g_0
    assert pd.read_csv(out / "compress_summary.csv").shape[0] == 1


def test_variance_on_dump_and_synthetic(tiny_dump, tmp_path):
    out = tmp_path / "var"
    assert (
        run(
            "variance",
            tiny_dump,
            "--out",
            out,
            "--compressor",
            "dqsg:M=2",
            "--compressor",
            "qsgd:s=4",
            "--n",
            "512",
            "--trials",
            "100",
            "--quiet",
        )
        == 0
    )
    df = pd.read_csv(out / "variance.csv")
    assert len(df) == 4 and set(df["verdict"]) <= {"holds", "tight"}
    dq = df[df["compressor"] == "dqsg:M=2"]
    assert ((dq["ci_low"] <= dq["bound"]) & (dq["bound"] <= dq["ci_high"])).all()
    for law in ("exponential", "gamma", "genpareto", "normal"):
        assert (
            run(
                "variance",
                "--synthetic",
                law,
                "--out",
                tmp_path / law,
                "--compressor",
                "randk:ratio=0.1",
                "--trials",
                "50",
                "--vectors",
                "1",
                "--n",
                "500",
                "--quiet",
            )
            == 0
        )
        syn = pd.read_csv(tmp_path / law / "variance.csv")
        assert syn["vector"].iloc[0] == f"synthetic {law_label(law)} #0" and syn["bound"].iloc[0] == pytest.approx(0.9)


def test_feedback_reports_eta_per_beta(tiny_dump, tmp_path):
    out = tmp_path / "fb"
    assert (
        run(
            "feedback",
            tiny_dump,
            "--out",
            out,
            "--beta",
            "0.2,1",
            "--n",
            "1024",
            "--length",
            "6",
            "--seeds",
            "3",
            "--quiet",
        )
        == 0
    )
    df = pd.read_csv(out / "feedback.csv")
    assert list(df["beta"]) == [0.2, 1.0]
    assert math.isfinite(df["eta"].iloc[0]) and math.isinf(df["eta"].iloc[1])  # beta = 1 is outside (15)'s range
    assert df["verdict"].iloc[0] in ("holds", "tight") and df["verdict"].iloc[1] == "not applicable"
    assert (out / "feedback_eta_vs_beta.png").exists()


def test_plot_variance_vs_gain(tmp_path):
    out = tmp_path / "plot"
    assert run("plot", "variance-vs-gain", "--n", "64", "--trials", "5", "--out", out, "--quiet") == 0
    df = pd.read_csv(out / "variance_vs_gain.csv")
    assert set(df["method"]) == {"QCS (min over k, Q)", "QSGD (Lemma 3.1)", "Wangni (uniform p)"}
    assert set(df["series"]) == {"theory", "measured"}
    assert (out / "variance_vs_gain.png").stat().st_size > 1000


def test_validate_exit_status_follows_the_verdicts(tmp_path, monkeypatch):
    out = tmp_path / "val"
    assert run("validate", "--quick", "--checks", "qcs-gamma,topk-contraction", "--out", out, "--quiet") == 0
    df = pd.read_csv(out / "validation.csv")
    assert list(df["check"]) == ["qcs-gamma", "topk-contraction"] and set(df["verdict"]) == {"holds"}
    from gradstat.compressors.schemes.quantizers.qcs import QCS

    monkeypatch.setattr(QCS, "reconstruction_scale", lambda self: 1.1)
    assert run("validate", "--quick", "--checks", "qcs-gamma", "--out", out, "--quiet") == 1


def test_validate_on_a_dump(tiny_dump, tmp_path):
    out = tmp_path / "vald"
    assert run("validate", tiny_dump, "--quick", "--checks", "qcs-gamma,dqsg", "--out", out, "--quiet") == 0
    assert set(pd.read_csv(out / "validation.csv")["verdict"]) <= {"holds", "tight"}


def test_report_puts_every_section_together(tiny_dump, tmp_path):
    out = tmp_path / "rep"
    # a name and a family prefix (ndqsg: its three checks, the fastest family; GMC's prose is read in tests/report)
    assert run("report", tiny_dump, "--out", out, "--quick", "--checks", "qcs-gamma,ndqsg", "--quiet") == 0
    text = (out / "report.md").read_text()
    for heading in (
        "## Distribution of gradient magnitudes",
        "## Threshold quality",
        "## Compressors replayed",
        "## Variance vs closed-form bounds",
        "## Error feedback",
        "## Variance vs compression gain",
        "## Validation",
        "## Known disagreements",
    ):
        assert heading in text
    for png in ("fit_pdf_cdf", "threshold_k_ratio", "feedback_eta_vs_beta", "variance_vs_gain"):
        assert f"({png}.png)" in text and (out / f"{png}.png").exists() and (out / f"{png}.csv").exists()
    val = pd.read_csv(out / "validation.csv")
    assert list(val["check"]) == ["qcs-gamma", "ndqsg-failure", "ndqsg-error", "ndqsg-failure-chebyshev"]
    assert "| qcs-gamma |" in text


@pytest.mark.slow
def test_demo_records_and_reports(tmp_path):
    out = tmp_path / "demo"
    assert run("demo", "--out", out, "--workload", "fc300", "--iterations", "2", "--quick", "--quiet") == 0
    assert "workload **fc300**" in (out / "report.md").read_text()
    from gradstat.analysis.dumps import open_dump

    assert open_dump(out / "dump").steps == [0, 1]  # the demo keeps its dump


@pytest.mark.parametrize(
    "args, message",
    [
        (["fit", "/nonexistent/dump"], "nonexistent"),
        (["threshold", "{dump}", "--ratio", "1.5"], "--ratio: 1.5"),
        (["fit", "{dump}", "--steps", "99"], "--steps: 99 is not available"),
        (["compress", "{dump}", "--compressor", "nosuch"], "unknown compressor 'nosuch'"),
        (["compress", "{dump}", "--compressor", "topk:ratio=2"], "ratio"),
        (["feedback", "{dump}", "--beta", "0"], "(0, 1]"),
        (["fit", "{dump}", "--layers", "conv*"], "matches no parameter"),
        (["variance"], "exactly one"),
        (["validate", "--checks", "nosuch"], "matches no check"),
        (["report", "/nonexistent/dump"], "nonexistent"),
        (["report", "{dump}", "--steps", "7"], "--steps: 7 is not available"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_dump, tmp_path, capsys, args, message):
    args = [a.replace("{dump}", str(tiny_dump)) for a in args] + ["--out", str(tmp_path / "x")]
    assert run(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gradstat: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()  # bad input is found before the result folder is made
