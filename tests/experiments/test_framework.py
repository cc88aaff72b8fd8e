"""The experiment framework: comparison verdicts are generated from the numbers, the registry and the command line
reject bad input with a clear message."""

from __future__ import annotations

import math

import pytest

from gradstat.analysis.cli.main import main
from gradstat.analysis.experiments.base import Comparison, comparison_table, overall_verdict
from gradstat.analysis.experiments.registry import experiments, get_experiment


def test_a_value_within_tolerance_reproduces_and_outside_it_differs_by_the_signed_relative_gap():
    assert Comparison("x", 2.0, "ref", 2.1, tolerance=0.1).verdict() == "reproduces"
    assert Comparison("x", 2.0, "ref", 2.5, tolerance=0.1).verdict() == "differs (+25%)"
    assert Comparison("x", 1e-30, "ref", 0.5e-30, tolerance=0.1).verdict() == "differs (-50%)"


def test_bounds_and_claims_are_judged_by_their_direction():
    assert Comparison("x", 0.05, "ref", 0.049, kind="at_most").holds()
    assert not Comparison("x", 0.05, "ref", 0.051, kind="at_most").holds()
    assert Comparison("x", 2.0, "ref", 3.0, kind="at_least").holds()
    assert Comparison("x", 1.0, "ref", 1.0, kind="claim").verdict() == "claim holds"
    assert Comparison("x", 1.0, "ref", 0.0, kind="claim").verdict() == "claim fails"


def test_nan_is_not_comparable_and_never_counted_as_agreement():
    rows = [Comparison("a", math.nan, "ref", 1.0), Comparison("b", 1.0, "ref", 1.0)]
    assert rows[0].verdict() == "not comparable"
    assert overall_verdict(rows) == "reproduces: all 1 comparable published results agree"
    assert overall_verdict(rows[:1]).startswith("nothing comparable")


def test_overall_verdict_names_the_disagreements():
    rows = [Comparison("good", 1.0, "ref", 1.0), Comparison("bad", 1.0, "ref", 3.0)]
    line = overall_verdict(rows)
    assert line.startswith("differs: 1 of 2 agree") and "bad: paper 1, ours 3" in line
    assert list(comparison_table(rows)["verdict"]) == ["reproduces", "differs (+200%)"]


def test_registry_lists_every_experiment_with_a_runtime():
    found = experiments()
    assert {"qcs-fig2", "ecq-syn", "gmc", "sidco-quality", "layerwise"} <= set(found)
    assert all(e.quick_s > 0 and e.full_s > e.quick_s for e in found.values())


def test_unknown_experiment_names_the_known_ones():
    with pytest.raises(ValueError, match="known: .*qcs-fig2"):
        get_experiment("nope")


def test_cli_lists_and_rejects_bad_input(tmp_path, capsys):
    assert main(["experiment", "list"]) == 0
    assert "sidco-quality" in capsys.readouterr().out
    assert main(["experiment", "gmc"]) == 2  # no --out
    assert "--out DIR is required" in capsys.readouterr().err
    assert main(["experiment", "gmc", "--quick", "--workload", "lenet", "--out", str(tmp_path)]) == 2
    assert "takes no --workload" in capsys.readouterr().err
    assert main(["experiment", "sidco-quality", "--quick", "--workload", "vgg", "--out", str(tmp_path)]) == 2
    assert "not supported" in capsys.readouterr().err
