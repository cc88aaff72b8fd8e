"""The mutation suite: every validation check against realistic planted bugs in the code it checks.

Each mutation of :data:`gradstat.analysis.validation.mutations.MUTATIONS` patches the code under test (monkeypatch
style, undone afterwards) and runs its check at the quick Monte Carlo size with seed 0 (99 % intervals, so the
verdicts are deterministic). A mutation without a stated reason must turn its check to ``violated``; a known
survivor must say why the check cannot see it, and when it names a companion check, that companion must carry the
same mutation as a required kill. ``reports/mutations.md`` is the table of the same run.
"""

from __future__ import annotations

import pytest

from gradstat.analysis.validation import registry
from gradstat.analysis.validation.mutations import MUTATIONS, planted, render, run_mutation

LOOSE = {
    "ndqsg-failure-chebyshev": "Theorem 6's Chebyshev bound, reported only",
    "gmc-memory": "Theorem 9's bound, 10^4-10^5 times the memory",
}
"""Checks kept as the paper's claim whose planted bugs are all caught by a companion (named in the catalogue)."""


@pytest.mark.parametrize("m", MUTATIONS, ids=[f"{m.check}/{m.name}" for m in MUTATIONS])
def test_planted_bug_turns_its_check_to_violated(m):
    row = run_mutation(m)
    if m.why:
        assert row["killed"] or row["verdict"] != "violated"  # an explained survivor may still be caught
    else:
        assert row["killed"], f"{m.check} did not catch '{m.bug}': {row['verdict']} {row['measured']}"


def test_every_check_has_at_least_two_planted_bugs_it_must_catch():
    for check in registry.names():
        mine = [m for m in MUTATIONS if m.check == check]
        required = [m for m in mine if not m.why]
        assert len(mine) >= 2, f"{check} has {len(mine)} planted bugs"
        assert len(required) >= 2 or check in LOOSE, f"{check}: only {len(required)} required kills"


def test_every_explained_survivor_is_caught_by_its_companion():
    required = {(m.check, m.name) for m in MUTATIONS if not m.why}
    for m in MUTATIONS:
        if m.caught_by:
            assert (m.caught_by, m.name) in required, f"{m.check}/{m.name}: {m.caught_by} does not carry it"
        if m.check in LOOSE:
            assert m.caught_by, f"{m.check}/{m.name} survives with no companion"


def test_patches_are_undone_after_the_run():
    from gradstat.compressors.schemes.quantizers.qcs import QCS

    before = QCS.reconstruction_scale
    m = next(m for m in MUTATIONS if m.name == "alpha-1.1")
    with planted(m):
        assert QCS.reconstruction_scale is not before
    assert QCS.reconstruction_scale is before


def test_kill_table_lists_survivors_with_their_reason():
    import pandas as pd

    df = pd.DataFrame(
        [
            {
                "check": "a",
                "mutation": "x",
                "bug": "b",
                "verdict": "violated",
                "killed": True,
                "measured": "",
                "why_survives": "",
                "caught_by": "",
                "seconds": 0.1,
            },
            {
                "check": "a",
                "mutation": "y",
                "bug": "c",
                "verdict": "holds",
                "killed": False,
                "measured": "",
                "why_survives": "too loose",
                "caught_by": "",
                "seconds": 0.1,
            },
        ]
    )
    text = render(df)
    assert "1 of 2 planted bugs caught (50%)" in text and "`a` / `y` (c): too loose" in text
    assert "0 of them are caught by the companion check named" in text and "1 by no check (`a` / `y`)" in text
