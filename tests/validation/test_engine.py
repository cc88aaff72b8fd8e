"""The validation engine: verdict rules, confidence intervals, the check registry."""

from __future__ import annotations

import numpy as np
import pytest

from gradstat.analysis.measure.intervals import Estimate, mean_ci, proportion_ci, quantile_interval
from gradstat.analysis.validation import registry
from gradstat.analysis.validation.engine import Check, Measurement, NotApplicable, verdict


def est(low: float, high: float) -> Estimate:
    return Estimate((low + high) / 2, low, high, 10)


@pytest.mark.parametrize(
    "low, high, expected", [(0.1, 0.9, "holds"), (0.5, 1.5, "tight"), (1.1, 2.0, "violated"), (0.5, 1.0, "tight")]
)
def test_upper_bound_verdicts(low, high, expected):
    assert verdict("upper", 1.0, est(low, high)) == expected


@pytest.mark.parametrize("low, high, expected", [(1.1, 2.0, "holds"), (0.5, 1.5, "tight"), (0.1, 0.9, "violated")])
def test_lower_bound_verdicts(low, high, expected):
    assert verdict("lower", 1.0, est(low, high)) == expected


def test_equality_holds_when_interval_meets_value_within_tolerance():
    assert verdict("equal", 1.0, est(0.9, 1.1)) == "holds"
    assert verdict("equal", 1.0, est(1.05, 1.1)) == "violated"
    assert verdict("equal", 1.0, est(1.05, 1.1), tolerance=0.06) == "holds"


def test_no_theory_value_is_not_applicable():
    assert verdict("upper", None, est(0, 1)) == "not applicable"
    assert verdict("upper", float("inf"), est(0, 1)) == "not applicable"


def test_mean_ci_covers_the_true_mean_at_its_level():
    """Coverage of the 99 % t-interval over 2000 normal samples of size 20: binomial sd of the coverage is 0.0022,
    so 0.99 +- 0.01 is a > 4-sigma acceptance band."""
    rng = np.random.default_rng(0)
    hits = [(lambda e: e.low <= 3.0 <= e.high)(mean_ci(rng.normal(3.0, 2.0, 20))) for _ in range(2000)]
    assert abs(np.mean(hits) - 0.99) < 0.01


def test_proportion_ci_is_clopper_pearson():
    e = proportion_ci(0, 100, 0.95)
    assert e.low == 0.0 and e.high == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-9)  # exact at 0 successes
    e = proportion_ci(50, 100, 0.95)
    assert e.low < 0.5 < e.high


def test_interval_inputs_are_checked():
    with pytest.raises(ValueError, match="at least 2"):
        mean_ci([1.0])
    with pytest.raises(ValueError, match="NaN"):
        mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="level"):
        mean_ci([1.0, 2.0], level=1.5)
    with pytest.raises(ValueError, match="successes"):
        proportion_ci(5, 3)
    assert quantile_interval(np.arange(101), 0.9) == pytest.approx((5.0, 95.0))


def test_a_check_that_cannot_run_reports_not_applicable():
    def measure(s):
        raise NotApplicable("missing piece")

    r = Check("x", "src", "upper", "q", measure, {"quick": 2, "full": 2}).run()
    assert r.verdict == "not applicable" and "missing piece" in r.note and not r.failed


def test_a_violated_must_hold_check_fails():
    c = Check("x", "src", "upper", "q", lambda s: Measurement(1.0, mean_ci([2.0, 2.1, 2.2])), {"quick": 3, "full": 3})
    assert c.run().failed
    assert not Check("x", "src", "upper", "q", c.measure, {"quick": 3, "full": 3}, must_hold=False).run().failed


def test_registry_names_are_unique_and_selectable():
    names = registry.names()
    assert len(names) == len(set(names)) >= 15
    assert {c.name for c in registry.select("qcs")} >= {"qcs-gamma", "qcs-mmse", "qcs-unbiased", "qcs-lemma1"}
    with pytest.raises(ValueError, match="matches no check"):
        registry.select("nonsense")


def _by_seed(values: dict[int, list[float]]):
    """A measure whose samples depend on the setting's seed (theory 1.0, upper claim)."""
    return lambda s: Measurement(1.0, mean_ci(values[s.seed]))


def test_a_statistical_violation_stands_only_when_an_independent_replication_is_violated_too():
    from gradstat.analysis.validation.engine import REPLICATION_SEED

    once = {0: [2.0, 2.1, 2.2], REPLICATION_SEED: [0.1, 0.2, 0.3]}
    r = Check("x", "src", "upper", "q", _by_seed(once), {"quick": 3, "full": 3}).run(seed=0)
    assert r.verdict == "holds" and not r.failed
    assert "seed 0: 2.1 [" in r.note and f"replicated at seed {REPLICATION_SEED}: 0.2 [" in r.note
    twice = {0: [2.0, 2.1, 2.2], REPLICATION_SEED: [1.9, 2.0, 2.1]}
    r = Check("x", "src", "upper", "q", _by_seed(twice), {"quick": 3, "full": 3}).run(seed=0)
    assert r.verdict == "violated" and r.failed and "(violated)" in r.note


def test_a_deterministic_violation_is_not_replicated():
    calls = []

    def measure(s):
        calls.append(s.seed)
        return Measurement(1.0, Estimate(2.0, 2.0, 2.0, 1), deterministic=True)

    assert Check("x", "src", "equal", "q", measure, {"quick": 3, "full": 3}).run().verdict == "violated"
    assert calls == [0]


FALSE_ALARM_SEED = 142
"""A seed at which the first 300 trials of half-dither-exact on its synthetic block miss the exact value (found by
running seeds 0-142: the first of them; about one in a hundred is expected at 99 %)."""


def test_the_lenet_half_dither_violation_is_a_one_in_a_hundred_false_alarm():
    """half-dither-exact on a lenet dump at seed 0 measured 0.8013 [0.7927, 0.8098] against the exact 0.8117: the
    quantizer and the closed form agree over 30,000 trials (z = -1.4), and over 100 disjoint batches of 300 trials
    1 is outside its 99 % interval, as expected. The same happens on the synthetic block: at FALSE_ALARM_SEED the
    first 300 trials miss the exact value, and the check's replication (fresh seeds, the same vector) holds."""
    from gradstat.analysis.validation.engine import Setting

    check = registry.get("half-dither-exact")
    first = check.measure(Setting(check.trials["quick"], FALSE_ALARM_SEED))
    assert verdict(check.claim, first.theory, first.estimate) == "violated"
    r = check.run("quick", seed=FALSE_ALARM_SEED)
    assert r.verdict == "holds" and "replicated at seed" in r.note
