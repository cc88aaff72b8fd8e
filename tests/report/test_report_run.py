"""A real report run with a subset of the checks (the issue's reproduction: ``report --quick --checks sidco``):
the text speaks only of what ran."""

from __future__ import annotations

import pandas as pd


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
