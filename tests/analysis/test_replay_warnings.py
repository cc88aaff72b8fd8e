"""The replay warns where its numbers would mislead, and only there: feedback over non-consecutive steps, an
adaptive SIDCo with no more steps than its adaptation period, an aggregate error growing past the gradient."""

from __future__ import annotations

import warnings

import pytest

from gradstat.analysis.cli.main import main
from gradstat.analysis.dumps import open_dump
from gradstat.analysis.studies.replay import ReplayConfig, ReplayWarning, replay


@pytest.fixture(scope="module")
def linreg_dumps(tmp_path_factory):
    """linreg (3,200 parameters), 2 workers: 8 consecutive iterations, and 8 iterations recorded every 2."""
    from gradstat.analysis.training.recorder import record

    root = tmp_path_factory.mktemp("replay-warnings")
    every1 = record("linreg", 8, workers=2, out=root / "every1", seed=0, progress=False)
    every2 = record("linreg", 8, every=2, workers=2, out=root / "every2", seed=0, progress=False)
    return open_dump(every1), open_dump(every2)


def _warnings(dump, spec: str, feedback: str = "none", steps=None) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        replay(dump, ReplayConfig(spec, feedback, steps=steps))
    return [str(w.message) for w in caught if issubclass(w.category, ReplayWarning)]


def test_feedback_over_steps_recorded_every_2_warns(linreg_dumps):
    _, every2 = linreg_dumps
    (msg,) = _warnings(every2, "topk:ratio=0.1", "ef")
    assert "steps 0, 2, 4, 6 are not consecutive" in msg and "recorded every 2 iterations" in msg


def test_feedback_over_a_selection_with_gaps_warns(linreg_dumps):
    every1, _ = linreg_dumps
    (msg,) = _warnings(every1, "topk:ratio=0.1", "qcs:beta=0.5", steps=[0, 1, 3])
    assert "not consecutive (the selection skips steps)" in msg and "2 iterations later" in msg


def test_no_warning_without_feedback_or_over_consecutive_steps(linreg_dumps):
    every1, every2 = linreg_dumps
    assert _warnings(every2, "topk:ratio=0.1", "none") == []
    assert _warnings(every1, "topk:ratio=0.1", "ef") == []


def test_growing_error_of_qsgd_with_error_feedback_warns(linreg_dumps):
    every1, _ = linreg_dumps
    (msg,) = _warnings(every1, "qsgd:s=1", "ef")
    assert "grows over the replay" in msg and "not a contraction" in msg and "at step 7" in msg


def test_a_bounded_error_does_not_warn(linreg_dumps):
    every1, _ = linreg_dumps
    assert _warnings(every1, "qsgd:s=1", "none") == []  # large (about 13) but not growing
    assert _warnings(every1, "topk:ratio=0.1", "ef") == []  # growing residual, error of the update below 1


def test_adaptive_sidco_with_too_few_steps_warns(linreg_dumps):
    every1, _ = linreg_dumps
    (msg,) = _warnings(every1, "sidco:ratio=0.01,period=5", steps=[0, 1, 2, 3, 4])
    assert "period = 5" in msg and "replay has 5 steps" in msg
    assert _warnings(every1, "sidco:ratio=0.01,period=5", steps=list(range(6))) == []
    assert _warnings(every1, "sidco:ratio=0.01,stages=2", steps=[0, 1, 2]) == []


def test_the_command_prints_each_warning_on_one_line(linreg_dumps, tmp_path, capsys):
    _, every2 = linreg_dumps
    code = main(
        ["compress", str(every2.path), "--compressor", "topk:ratio=0.1", "--feedback", "ef", "--quiet"]
        + ["--out", str(tmp_path / "c")]
    )
    err = capsys.readouterr().err
    assert code == 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gradstat: warning: topk:ratio=0.1 with feedback ef: steps")
