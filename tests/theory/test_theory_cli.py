"""``gradstat theory ...`` commands: tables with sources, JSON output, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import math

import pytest

from gradstat.analysis.cli.main import main
from gradstat.theory import dqsg, qcs


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["theory", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys, *argv: str) -> dict[str, dict]:
    rc, out, _ = _run(capsys, *argv, "--json")
    assert rc == 0
    return {row["quantity"]: row for row in json.loads(out)}


def test_qcs_table_prints_values_with_sources(capsys):
    rc, out, _ = _run(capsys, "qcs", "--n", "256", "--k", "32", "--Q", "4")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["quantity", "value", "source"]
    gamma_line = next(line for line in lines if line.startswith("gamma"))
    assert "7.44719" in gamma_line and "QCS (Abdi & Fekri) Thm 2" in gamma_line and "(10)" in gamma_line


def test_qcs_json_matches_the_theory_functions(capsys):
    rows = _json(capsys, "qcs", "--n", "256", "--k", "32", "--Q", "4")
    assert rows["gamma (variance factor)"]["value"] == pytest.approx(qcs.gamma(256, 32, 4))
    assert rows["gain (scale ignored)"]["value"] == pytest.approx(qcs.gain(256, 32, 4))
    assert all(row["source"] for row in rows.values())


def test_qcs_optimal(capsys):
    rows = _json(capsys, "qcs-optimal", "--n", "256", "--gain", "32")
    best = qcs.optimal_pair(256, 32)
    assert (rows["k"]["value"], rows["Q"]["value"]) == (best.k, best.Q)
    assert rows["gain (scale ignored)"]["value"] >= 32


def test_eta_reports_no_bound_as_null_with_reason(capsys):
    rows = _json(capsys, "eta", "--gamma", "1", "--beta", "0.3", "--mmse")
    assert rows["eta"]["value"] is None and "no bound" in rows["eta"]["note"]
    rows = _json(capsys, "eta", "--gamma", "2", "--beta", "0.3")
    assert rows["eta"]["value"] == pytest.approx(2 / (1 - (0.49 + 0.18)))
    assert rows["eta*"]["value"] == pytest.approx(6.0)


def test_dqsg_and_ndqsg(capsys):
    rows = _json(capsys, "dqsg", "--n", "1000", "--M", "2")
    assert rows["Delta"]["value"] == 0.5
    assert rows["bits per value (fixed)"]["value"] == 3
    rows = _json(capsys, "ndqsg", "--delta1", "1", "--delta2", "3", "--alpha", "1", "--sigma-z", "0.6")
    assert rows["failure bound"]["value"] == pytest.approx(dqsg.nested_failure_bound(1, 3, 1, 0.6))
    assert rows["failure probability (Gaussian z, exact)"]["value"] == pytest.approx(
        dqsg.nested_failure_probability(1, 3, 1, 0.6)
    )


def test_sidco_threshold_gamma_uses_exact_quantile_and_paper_approximation(capsys):
    from scipy import stats

    rows = _json(capsys, "sidco-threshold", "--dist", "gamma", "--shape", "0.5", "--scale", "1", "--ratio", "0.001")
    exact = rows["threshold eta (exact quantile 1 - delta)"]["value"]
    assert exact == pytest.approx(stats.gamma(a=0.5).isf(0.001), rel=1e-6)
    approx = rows["threshold eta (gamma approximation)"]["value"]
    assert approx == pytest.approx(-(math.log(0.001) + math.lgamma(0.5)), rel=1e-12)
    assert approx > exact  # (24) is an upper bound for shape <= 1 and x >= 1


def test_sidco_threshold_exponential_and_binomial_law(capsys):
    rows = _json(capsys, "sidco-threshold", "--dist", "exponential", "--scale", "2", "--ratio", "0.01", "--d", "10000")
    assert rows["threshold eta (exact quantile 1 - delta)"]["value"] == pytest.approx(2 * math.log(100), rel=1e-9)
    assert rows["E[k_hat]"]["value"] == pytest.approx(100)
    assert rows["k_hat 95% interval low"]["value"] < 100 < rows["k_hat 95% interval high"]["value"]


@pytest.mark.parametrize(
    "argv, word",
    [
        (["qcs", "--n", "256", "--k", "300", "--Q", "4"], "k must be"),
        (["qcs-optimal", "--n", "16", "--gain", "1e6"], "target_gain"),
        (["eta", "--gamma", "2", "--beta", "0"], "beta"),
        (["ndqsg", "--delta1", "1", "--delta2", "2.5", "--sigma-z", "1"], "delta2/delta1"),
        (["sidco-threshold", "--dist", "gamma", "--scale", "1", "--ratio", "0.01"], "--shape"),
        (["sidco-threshold", "--dist", "exponential", "--scale", "1", "--ratio", "1.5"], "--ratio"),
    ],
)
def test_bad_input_is_a_one_line_error_with_status_2(capsys, argv, word):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    assert err.startswith("gradstat: error: ") and word in err
    assert len(err.strip().splitlines()) == 1
