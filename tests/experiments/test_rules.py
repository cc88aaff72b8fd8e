"""The experiments' verdict rules (analysis/experiments/rules.py), one test per rule, and the experiments that
apply them (SIDCo's estimation quality, QCS Fig. 2) built from made-up per-step rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gradstat.analysis.experiments.base import Comparison, overall_verdict
from gradstat.analysis.experiments.rules import (
    per_step_share,
    stated_for,
    steps_or_never,
    sufficient_condition_holds,
    time_ratio,
)


def _steps(workload: str, estimator: str, ratio: float, q: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"workload": workload, "ratio": ratio, "estimator": estimator, "k_ratio": q})


def _summary(per_step: pd.DataFrame) -> pd.DataFrame:
    return (
        per_step.groupby(["workload", "ratio", "estimator"], sort=False)["k_ratio"].mean().rename("mean").reset_index()
    )


# rule 1: a claim about a distribution of steps is judged per step
def test_a_mean_on_target_does_not_make_a_per_step_claim_hold():
    from gradstat.analysis.experiments.sidco_quality import _compare

    q = np.r_[np.full(95, 0.2), np.full(5, 16.2)]  # mean 1.0; 0 % of steps within 1 +- 0.2
    steps = _steps("resnet20", "sidco-exp", 0.01, q)
    (row,) = _compare(_summary(steps), steps)
    assert row.kind == "share" and row.ours == 0.0 and row.holds() is False
    assert row.verdict().startswith("fails (0% of steps")


def test_a_share_straddling_the_requirement_is_undecided_and_said_so():
    e = per_step_share(np.r_[np.ones(18), np.full(2, 5.0)], lambda v: v <= 2.0)  # 90 % of 20 steps
    assert e.mean == pytest.approx(0.9) and e.low < 0.9 < e.high
    row = Comparison("q", 0.9, "ref", e.mean, kind="share", low=e.low, high=e.high)
    assert row.holds() is None and row.verdict().startswith("undecided (90% of steps")
    assert "1 per-step claims undecided" in overall_verdict([row])


def test_the_upper_end_claim_is_judged_on_every_step_not_the_mean():
    from gradstat.analysis.experiments.sidco_quality import _compare

    q = np.r_[np.full(80, 0.5), np.full(20, 5.8)]  # mean 1.56 <= 2, but a fifth of the steps above 2
    steps = _steps("lstm", "sidco-gamma", 0.01, q)
    upper = [r for r in _compare(_summary(steps), steps) if "<= 2" in r.quantity]
    assert len(upper) == 1 and upper[0].ours == pytest.approx(0.8) and upper[0].holds() is False


def test_nan_steps_count_as_not_meeting_the_claim():
    assert per_step_share([1.0, float("nan")], lambda v: v > 0).mean == 0.5
    with pytest.raises(ValueError, match="at least one step"):
        per_step_share([], lambda v: v > 0)


# rule 2: a paper value is compared only where the paper states it
def test_a_paper_value_exists_only_where_the_paper_states_it():
    from gradstat.analysis.experiments.sidco_quality import STATED_LSTM, _compare

    assert stated_for("lstm", STATED_LSTM) and not stated_for("resnet20", STATED_LSTM)
    q = np.full(30, 0.01)
    steps = pd.concat([_steps(w, "redsync", 0.001, q) for w in ("resnet20", "lstm")])
    rows = _compare(_summary(steps), steps)
    assert [r.quantity.split(",")[0] for r in rows] == ["lstm"]


# rule 3: non-convergence counts the same way for every method
def test_non_convergence_counts_the_run_length_plus_one_for_every_method():
    assert steps_or_never(math.inf, 100) == (101.0, False) and steps_or_never(40, 100) == (40.0, True)
    assert time_ratio(math.inf, 20, 100) == (101 / 20, "lower bound")  # the numerator's method never converged
    assert time_ratio(20, math.inf, 100) == (20 / 101, "upper bound")  # the same rule for the other method
    ratio, what = time_ratio(math.inf, math.inf, 100)
    assert math.isnan(ratio) and what == "neither converged"
    assert time_ratio(50, 25, 100) == (2.0, "exact")


# rule 4: sufficient conditions are shown as such
def test_a_sufficient_condition_is_checked_below_its_limit_only():
    mus, ok = [0.05, 0.1, 0.2, 0.3, 0.4], [True, True, True, True, False]
    assert sufficient_condition_holds(mus, ok, 0.25) == 1.0  # 0.3 converging too says nothing against it
    assert sufficient_condition_holds(mus, [True, False, True, True, True], 0.25) == 0.0
    assert math.isnan(sufficient_condition_holds([0.3], [True], 0.25))
    row = Comparison("every mu < 0.25 converges", 1.0, "ref", 1.0, kind="claim", paper_text="sufficient")
    assert row.verdict() == "claim holds"
