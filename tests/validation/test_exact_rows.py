"""Equality checks with nothing random are one measurement, not an interval; synthetic vectors are labelled by
the one naming table of the laws."""

from __future__ import annotations

import pytest

from gradstat.analysis.measure.sources import LAWS, GradientSource
from gradstat.analysis.validation import registry
from gradstat.analysis.validation.checks.common import exact_agreement, origin
from gradstat.analysis.validation.engine import Setting


def test_exact_agreement_is_the_reference_plus_the_largest_deviation():
    theory, est = exact_agreement([1.0, 2.0, 3.5], [1.0, 2.1, 3.0])
    assert theory == pytest.approx(2.0333333333333)
    assert est.mean == est.low == est.high == pytest.approx(theory + 0.5) and est.trials == 3
    with pytest.raises(ValueError, match="equal, non-empty"):
        exact_agreement([1.0], [1.0, 2.0])


@pytest.mark.parametrize("name", ["topk-best-k", "randk-exact", "gmc-memory-recursion", "qcs-feedback-recursion"])
def test_a_deterministic_equality_is_one_measurement(name):
    row = registry.get(name).run("quick").row()
    assert row["deterministic"] and row["trials"] == 1 and row["verdict"] == "holds"
    assert row["ci_low"] != row["ci_low"] and row["ci_high"] != row["ci_high"]  # NaN: no interval


def test_synthetic_vectors_are_labelled_by_their_law():
    assert "Laplace(1)" in origin(Setting(10), 100) and "exponential" not in origin(Setting(10), 100)
    assert GradientSource().label == "synthetic Laplace(1)"
    assert GradientSource(family="gamma").label == f"synthetic {LAWS['gamma']}"
