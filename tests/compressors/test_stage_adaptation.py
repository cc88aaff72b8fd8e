"""SIDCo's stage adaptation (gradstat.compressors.schemes.sparsifiers.stage_adaptation): the ``error`` search explores
before it reverses, finds a good M behind a worse one, settles, and says when no M meets the tolerance."""

from __future__ import annotations

import pytest

from gradstat.compressors import create
from gradstat.compressors.schemes.sparsifiers.stage_adaptation import StageState, record


def feed(qualities_by_m: dict[int, float], periods: int, max_stages: int = 8, eps: float = 0.2) -> StageState:
    """Run the ``error`` rule with Q = 1 against a fixed map M -> k_hat/k; return the state."""
    state = StageState()
    for _ in range(periods):
        record(state, qualities_by_m[state.stages], state.stages, 1, eps, max_stages, "error")
    return state


def test_a_worse_m2_does_not_hide_a_good_m3():
    """The measured resnet20 GP case at delta = 0.001: M = 1, 2, 3 give 2.08, 2.26, 1.03. The old rule turned
    back at M = 2 and cycled 1 <-> 2; the search goes on to M = 3 and stays there."""
    q = {1: 2.08, 2: 2.26, 3: 1.03, 4: 0.7, 5: 0.5, 6: 0.4, 7: 0.3, 8: 0.2}
    state = feed(q, periods=20)
    assert [m for m, _ in state.history][:4] == [1, 2, 3, 3]
    assert state.stages == 3 and state.settled == "within"
    assert all(m == 3 for m, _ in list(state.history)[2:])


def test_explores_upwards_first_then_reverses_only_when_nothing_is_left_above():
    q = {1: 3.0, 2: 2.5, 3: 2.0}
    state = StageState(stages=2)
    for _ in range(3):
        record(state, q[state.stages], state.stages, 1, 0.2, 3, "error")
    assert [m for m, _ in state.history] == [2, 3, 1]


def test_when_no_m_meets_the_tolerance_it_settles_on_the_best_and_says_so():
    q = {1: 2.08, 2: 2.26, 3: 1.6, 4: 1.9}
    state = feed(q, periods=12, max_stages=4)
    assert state.settled == "none_within"
    assert state.stages == 3
    assert [m for m, _ in state.history][4:] == [3] * 8  # no cycling once every M has been measured
    assert "no M meets" in state.verdict(1, 0.2) and "M = 3" in state.verdict(1, 0.2)


def test_a_state_with_fewer_than_q_calls_says_it_never_adapted():
    c = create("sidco:ratio=0.001")
    state = c.new_state()
    for _ in range(4):
        c._adapt(state, 3.0, state.stages)
    assert state.stages == 1
    assert state.verdict(c.period, c.eps).startswith("not adapted: 4 call(s) < Q = 5")


def test_drifting_out_of_tolerance_restarts_the_search():
    state = feed({1: 2.0, 2: 1.1, 3: 0.5}, periods=3, max_stages=3)
    assert state.stages == 2 and state.settled == "within"
    record(state, 0.5, 2, 1, 0.2, 3, "error")  # M = 2 now under-selects: old records are dropped
    assert state.measured == {2: 0.5} and state.settled == "searching"
    assert state.stages in (1, 3)


@pytest.mark.parametrize("rule", ["error", "paper"])
def test_m_stays_within_one_and_max_stages(rule: str):
    state = StageState()
    for t in range(40):
        record(state, 5.0 if t % 7 else 0.1, state.stages, 1, 0.2, 3, rule)
        assert 1 <= state.stages <= 3
