"""A real report run with a subset of the checks (the issue's reproduction: ``report --quick --checks sidco``):
the text speaks only of what ran."""

from __future__ import annotations

import pandas as pd
import pytest


def test_report_with_only_the_sidco_checks_mentions_no_other_check(tmp_path):
    from gradstat.analysis.report.document import write_report

    path, failed = write_report(None, tmp_path, quick=True, progress=False, echo=lambda s: None, checks="sidco")
    text = path.read_text()
    ran = set(pd.read_csv(tmp_path / "validation.csv")["check"])
    assert ran == {c for c in ran if c.startswith("sidco-")} and not failed
    for other in ("dqsg-exact", "half-dither-exact", "ndqsg", "gmc-", "qcs-feedback", "topk-", "Theorem 9", "eq. (16)"):
        assert other not in text, other
    for fixed in ("d = 1000, s = 10", "4 workers", "decreases with beta", "table above"):
        assert fixed not in text, fixed
    assert "## Validation: 4 checks, 4 on synthetic vectors" in text
    assert "## Error feedback" not in text and "## Setup" not in text


def test_feedback_without_compressors_and_bad_specs_are_refused_before_any_work(tmp_path):
    import pytest

    from gradstat.analysis.report.document import write_report

    with pytest.raises(ValueError, match="--feedback applies"):
        write_report(None, tmp_path, quick=True, progress=False, echo=lambda s: None, feedback="ef")
    with pytest.raises(ValueError, match="unknown compressor 'nosuch'"):
        write_report(None, tmp_path, quick=True, progress=False, echo=lambda s: None, compressors=["nosuch"])
    assert not (tmp_path / "validation.csv").exists()


@pytest.mark.slow
def test_chosen_compressors_replace_the_default_comparison(tmp_path):
    from pathlib import Path

    from gradstat.analysis.report.document import write_report

    sample = Path(__file__).resolve().parents[2] / "data" / "samples" / "logreg-topk-ef"
    specs = ["topk:ratio=0.05", "qsgd:s=2,bucket=128"]
    path, _ = write_report(
        str(sample), tmp_path, True, None, "cpu", 0, False, lambda s: None, None, "qcs-gamma", specs, "ef"
    )
    text = path.read_text()
    assert "The compressors given with `--compressor`" in text
    for spec in specs:
        assert f"`{spec}` (ef)" in text
    assert "dqsg:M=4" not in text
    assert set(pd.read_csv(tmp_path / "compress_steps.csv")["compressor"]) == set(specs)
    assert set(pd.read_csv(tmp_path / "variance.csv")["compressor"]) == set(specs)
