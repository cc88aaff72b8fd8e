"""The report is rows -> Markdown: rendered from deliberately altered results, its prose follows the rows.

The rows come from real quick runs of a few checks and of the MMSE feedback table (fixed seeds, synthetic Laplace
vectors); each test then alters them (a verdict flipped, a check removed, other set-up values) and reads the text.
"""

from __future__ import annotations

import pandas as pd
import pytest

from gradstat.analysis.report.data import ReportData
from gradstat.analysis.report.render import render

CHECKS = (
    "qcs-gamma",
    "dqsg-exact",
    "half-dither-exact",
    "ndqsg-failure",
    "ndqsg-failure-chebyshev",
    "sidco-binomial-gamma-mle",
    "sidco-binomial-gamma",
    "gmc-memory",
    "gmc-memory-recursion",
    "qcs-feedback-mmse",
)


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    from gradstat.analysis.validation import registry

    return pd.DataFrame([registry.get(name).run("quick", seed=0).row() for name in CHECKS])


@pytest.fixture(scope="module")
def mmse_table() -> pd.DataFrame:
    from gradstat.analysis.measure.sources import GradientSource
    from gradstat.analysis.studies.feedback import feedback_table

    seq = [[GradientSource().vector(256, index=t)] for t in range(3)]
    table, _ = feedback_table("qcs:block=256,k=64,Q=4,alpha=mmse", [0.2, 1.0], seq, [0, 1], settle=True)
    return table.assign(workers=1)


def report(val: pd.DataFrame | None, **kw) -> str:
    data = ReportData(header={"size": "quick", "seed": 0}, validation=val, **kw)
    data.info["validation"] = {"size": "quick"}
    data.info["feedback_mmse"] = {"n": 256, "vectors": "synthetic", "spec": "qcs:block=256,k=64,Q=4,alpha=mmse"}
    return render(data)


def only(rows: pd.DataFrame, *names: str) -> pd.DataFrame:
    return rows[rows["check"].isin(names)].reset_index(drop=True)


def test_a_run_with_some_checks_says_nothing_about_the_others(rows):
    text = report(only(rows, "sidco-binomial-gamma", "sidco-binomial-gamma-mle"))
    for absent in (
        "dqsg-exact",
        "half-dither",
        "DQSG",
        "NDQSG",
        "Theorem 9",
        "GMC",
        "eq. (16)",
        "decreases",
        "d = 1000",
    ):
        assert absent not in text, absent
    for section in ("## Setup", "## Distribution", "## Threshold", "## Compressors", "## Error feedback", "Fig. 3"):
        assert section not in text, section
    assert "SIDCo's closed-form gamma fit" in text and "## Validation: 2 checks, 2 on synthetic vectors" in text


def test_no_validation_run_means_no_validation_prose(rows):
    text = report(None)
    assert "Validation" not in text and "Known disagreements" not in text


def test_a_verdict_flipped_to_violated_changes_the_sentence(rows):
    ok = report(rows)
    assert "both closed forms are confirmed" in ok
    flipped = rows.copy()
    i = flipped.index[flipped["check"] == "dqsg-exact"][0]
    flipped.loc[i, ["verdict", "empirical"]] = ["violated", 0.5]
    text = report(flipped)
    assert "both closed forms are confirmed" not in text
    assert "dithered 0.5 [" in text and "(violated)" in text
    assert "Must hold and violated: `dqsg-exact`" in text and "`dqsg-exact` 0.5" in text


def test_the_sidco_gamma_sentence_follows_its_verdict(rows):
    g = rows.copy()
    i = g.index[g["check"] == "sidco-binomial-gamma"][0]
    g.loc[i, "verdict"] = "holds"
    assert "meets the binomial law" in report(g) and "is biased in this run" not in report(g)
    g.loc[i, ["verdict", "empirical", "ci_low", "ci_high"]] = ["violated", 0.9, 0.88, 0.92]
    text = report(g)
    assert "is biased in this run" in text and "0.9 [0.88, 0.92]" in text and "meets the binomial law" not in text


def test_a_missing_check_drops_its_clause(rows):
    with_cheb = report(rows)
    assert "Chebyshev bound" in with_cheb
    text = report(rows[rows["check"] != "ndqsg-failure-chebyshev"])
    assert "Chebyshev" not in text and "NDQSG decoding failures" in text


def test_setup_values_come_from_the_rows(rows):
    g = rows.copy()
    i = g.index[g["check"] == "gmc-memory"][0]
    g.loc[i, "setup"] = g.loc[i, "setup"].replace("d=1000", "d=2000").replace("p=4", "p=7")
    gmc = next(line for line in report(g).splitlines() if line.startswith("- **GMC Theorem 9"))
    assert "d = 2000" in gmc and "p = 7" in gmc and "d = 1000" not in gmc


def test_the_validation_title_counts_the_vectors_of_the_rows(rows):
    g = rows.copy()
    g.loc[0, "vectors"] = "constructed (paper's counter-example)"
    g.loc[1, "vectors"] = "dump lenet step 3 worker 0 (block 0:1024 of 1663370)"
    title = next(line for line in report(g).splitlines() if line.startswith("## Validation"))
    n = len(g)
    kinds = f"1 on dump vectors, {n - 2} on synthetic vectors, 1 on constructed vectors"
    assert title == f"## Validation: {n} checks, {kinds} (dump lenet)"


def test_mmse_findings_follow_the_feedback_rows(rows, mmse_table):
    text = report(rows, feedback_mmse=mmse_table)
    at1 = mmse_table[mmse_table["beta"] == 1.0].iloc[0]
    assert f"steps T = {int(at1['steps'])}" in text and "block length n = 256" in text
    assert "The set-ups differ in the vectors" in text  # same n, T and workers as the validation row
    other = mmse_table.assign(steps=mmse_table["steps"] + 5)
    assert "The set-ups differ in steps T" in report(rows, feedback_mmse=other)
    rising = mmse_table.assign(empirical=[1.0, 2.0])
    assert "increases with beta" in report(rows, feedback_mmse=rising)
    assert "increases with beta" not in text


def test_a_deterministic_row_is_one_measurement(rows):
    g = rows.copy()
    g.loc[0, ["deterministic", "ci_low", "ci_high"]] = [True, float("nan"), float("nan")]
    text = report(g)
    line = next(x for x in text.splitlines() if x.startswith(f"| {g.loc[0, 'check']} |"))
    assert "| one measurement |" in line


def _with(rows: pd.DataFrame, check: str, **values: object) -> pd.DataFrame:
    g = rows.copy()
    i = g.index[g["check"] == check][0]
    for k, v in values.items():
        g.loc[i, k] = v
    return g


def test_the_gmc_sentence_follows_its_rows_and_is_absent_without_them(rows):
    gmc = next(line for line in report(rows).splitlines() if line.startswith("- **GMC Theorem 9"))
    r = rows[rows["check"] == "gmc-memory"].iloc[0]
    assert f"{float(r['theory_over_empirical']):.3g} times the measured memory" in gmc
    altered = _with(rows, "gmc-memory", theory_over_empirical=0.5, verdict="violated")
    text = report(altered)
    known = text.split("## Known disagreements")[1].split("## Other findings")[0]
    assert "the measured memory is 2 times the bound (violated" in known
    assert "loose" not in text
    gone = report(rows[~rows["check"].isin(["gmc-memory", "gmc-memory-recursion"])])
    assert "GMC" not in gone and "Theorem 9" not in gone


def test_known_disagreements_list_only_disagreements(rows):
    agreeing = rows.assign(verdict="holds")
    text = report(agreeing)
    assert "## Known disagreements" not in text and "## Other findings of this run" in text
    flipped = _with(agreeing, "dqsg-exact", verdict="violated")
    known = report(flipped).split("## Known disagreements")[1].split("## Other findings")[0]
    assert "DQSG vs QSGD-style" in known and "GMC Theorem 9" not in known


def test_every_report_ends_with_the_references_it_cites(rows):
    text = report(only(rows, "sidco-binomial-gamma", "sidco-binomial-gamma-mle"))
    refs = text.split("## References")[1]
    assert "Abdelmoniem" in refs and "MLSys 2021" in refs and "Statistical-based Gradient Compression" in refs
    assert "Zhao" not in refs
    full = report(rows).split("## References")[1]
    assert all(name in full for name in ("Abdi, Faramarz Fekri", "Zhao", "Abdelmoniem"))
    assert "## References" in render(ReportData(header={}, validation=only(rows, "gmc-memory")))


def test_related_results_are_linked_only_where_they_exist(tmp_path):
    from gradstat.analysis.report.document import related_results

    out = tmp_path / "demo"
    out.mkdir()
    assert related_results(out) == {}
    assert "Other results" not in render(ReportData(header={}))
    (tmp_path / "mutations.md").write_text("table")
    found = related_results(out)
    assert list(found.values()) == ["../mutations.md"]
    text = render(ReportData(header={}, related=found))
    assert "## Other results beside this report" in text and "(../mutations.md)" in text
    assert "experiments" not in text


def test_setup_line_shows_settings_as_text_not_a_python_dict():
    setup = {
        "workload": "lenet",
        "numel": 10,
        "tensors": 2,
        "workers": 2,
        "steps": [0, 1],
        "recorded": 2,
        "every": 1,
        "optimizer": {"name": "sgd", "lr": 0.02},
    }
    text = render(ReportData(header={}, setup=setup))
    assert "Optimizer: name=sgd, lr=0.02." in text and "{" not in text
