"""The mutation suite: every validation check against planted bugs in the code it checks.

Each mutation of :data:`gradstat.analysis.validation.mutations.MUTATIONS` patches the code under test (undone
afterwards) and runs its check at the quick Monte Carlo size with seed 0 (99 % intervals and fixed seeds, so the
verdicts are deterministic). Every patch must run (its calls are counted: a bug planted where nothing computes
plants nothing). A mutation without a stated reason must turn its check to ``violated``; a known survivor must say
why the check cannot see it and name a companion check that carries the same mutation as a required kill. A known
survivor's verdict is not asserted, so the default run shows its patches run in a 2-trial measurement of its check
and the slow run (``-m slow``) repeats that at the quick size.
``reports/mutations.md`` is the table of the same run.
"""

from __future__ import annotations

from unittest import mock

import pandas as pd
import pytest
import torch

from gradstat.analysis.validation import bugs, registry
from gradstat.analysis.validation.engine import Setting
from gradstat.analysis.validation.mutations import MUTATIONS, SURVIVORS, planted, render, run_mutation
from gradstat.analysis.validation.planting import Mutation

REQUIRED = [m for m in MUTATIONS if not m.why]
"""The mutations their check must kill."""
SURVIVORS_PLANTED = [m for m in MUTATIONS if m.why]
"""The known survivors: each says why its check cannot see it; only that its patch runs is required."""
FEW_TRIALS = 2
"""Monte Carlo trials of the short run that shows a known survivor's patch runs (every trial runs the patched code)."""


def _ids(ms: list[Mutation]) -> list[str]:
    return [f"{m.check}/{m.name}" for m in ms]


@pytest.mark.parametrize("m", REQUIRED, ids=_ids(REQUIRED))
def test_planted_bug_runs_and_turns_its_check_to_violated(m):
    row = run_mutation(m)
    assert row["calls"] > 0, f"{m.check}/{m.name}: a patch never ran ({row['verdict']})"
    assert row["killed"], f"{m.check} did not catch '{m.bug}': {row['verdict']} {row['measured']}"


def short_run_calls(m: Mutation) -> int:
    """The fewest calls of any of ``m``'s patches while its check measures at :data:`FEW_TRIALS` trials (a crash of
    the check counts the calls made before it, as in ``run_mutation``)."""
    with planted(m) as counts:
        try:
            registry.get(m.check).measure(Setting(FEW_TRIALS, seed=0))
        except Exception:  # the calls made before the crash are what is counted
            pass
    return min(counts)


@pytest.mark.parametrize("m", SURVIVORS_PLANTED, ids=_ids(SURVIVORS_PLANTED))
def test_a_known_survivor_s_patch_runs(m):
    """Every patch of the mutation runs in the check's own measurement at :data:`FEW_TRIALS` trials; the whole
    quick-size run is the slow test below."""
    assert short_run_calls(m) > 0, f"{m.check}/{m.name}: a patch never ran"


@pytest.mark.slow
@pytest.mark.parametrize("m", SURVIVORS_PLANTED, ids=_ids(SURVIVORS_PLANTED))
def test_a_known_survivor_s_patch_runs_at_the_quick_size(m):
    row = run_mutation(m)
    assert row["calls"] > 0, f"{m.check}/{m.name}: a patch never ran ({row['verdict']})"


def test_a_patch_that_never_runs_is_counted_as_such():
    unused = Mutation("topk-best-k", "unused", "a function Top-k never calls", lambda: bugs.decoder_seed(1))
    row = run_mutation(unused)
    assert row["calls"] == 0 and not row["killed"]
    assert short_run_calls(unused) == 0
    assert "1 mutations' patches never ran" in render(pd.DataFrame([row]))


def test_every_check_has_planted_bugs_and_every_must_hold_check_a_realistic_required_kill():
    for check in registry.names():
        mine = [m for m in MUTATIONS if m.check == check]
        assert len(mine) >= 2, f"{check} has {len(mine)} planted bugs"
        if registry.get(check).must_hold:
            required = [m for m in mine if m.kind == "realistic" and not m.why]
            assert required, f"{check} must hold but no realistic bug is a required kill"


def test_every_explained_survivor_names_a_companion_that_must_kill_it():
    required = {(m.check, m.name) for m in MUTATIONS if not m.why}
    planned = {(m.check, m.name) for m in MUTATIONS}
    for check, names in SURVIVORS.items():
        for name, (why, companion) in names.items():
            assert (check, name) in planned, f"{check}/{name} is explained but not planted"
            assert why and (companion, name) in required, f"{check}/{name}: {companion} does not carry it"


def test_the_realistic_set_is_planted_on_every_dithered_check():
    names = {c: {m.name for m in MUTATIONS if m.check == c and m.kind == "realistic"} for c in registry.names()}
    for check in ("qcs-gamma", "qcs-dither-exact", "dqsg-exact"):
        assert {"x1.03", "x0.97", "dither-kept", "dither-doubled", "seed+1", "dither-sign"} <= names[check]
    for check in ("topk-contraction", "topk-best-k", "randk-contraction", "randk-exact"):
        assert {"k-1", "k+1", "x1.03", "x0.97"} <= names[check]
    assert {"side-x1.3", "k-1", "k+1", "enc-dither-x2", "dec-dither-kept"} <= names["ndqsg-failure"]


def test_the_doubled_dither_reaches_the_codes_the_default_encode_computes():
    """The bug is planted around the row loop the default configuration runs (the C loop where it is built): the
    codes it sends are ``floor(y + 2u + 1/2)``, computed here from the counter dither, for all but round-off
    ties."""
    from gradstat import compressors
    from gradstat.compressors import Context

    comp = compressors.create("dqsg:M=4")
    g = torch.randn(4096, generator=torch.Generator().manual_seed(3))
    ctx = Context(seed=5, step=1)
    m = Mutation("dqsg-exact", "dither-doubled", "", lambda: bugs.encoder_dither(2.0))
    with planted(m) as counts:
        codes = comp.encode(g, ctx)["codes"].reshape(-1).double()
    assert counts == [1]
    u = bugs._dither(ctx.call_seed, g.numel(), g.device).double()
    y = g.double() / g.abs().max().double() * 4
    expected = torch.floor(y + 2 * u + 0.5).clamp(-4, 4)
    assert float((codes != expected).double().mean()) < 1e-3
    plain = comp.encode(g, ctx)["codes"].reshape(-1).double()
    assert float((plain != expected).double().mean()) > 0.1  # without the patch, the codes differ


def test_the_kept_dither_is_exactly_the_decoder_without_subtraction():
    from gradstat import compressors
    from gradstat.compressors import Context

    comp = compressors.create("dqsg:M=4")
    g = torch.randn(1000, generator=torch.Generator().manual_seed(4))
    ctx = Context(seed=2, step=0)
    payload = comp.encode(g, ctx)
    m = Mutation("dqsg-exact", "dither-kept", "", lambda: bugs.decoder_dither(1.0))
    with planted(m) as counts:
        out = comp.decode(payload, ctx).double()
    assert counts == [1]
    step = payload["scales"].double() / 4
    expected = payload["codes"].reshape(-1).double() * step
    assert torch.allclose(out, expected, rtol=1e-6, atol=1e-7 * float(step))


def test_patches_are_undone_after_the_run():
    from gradstat.compressors.schemes.quantizers.qcs import QCS

    before = QCS.reconstruction_scale
    m = next(m for m in MUTATIONS if m.name == "alpha-1.1")
    with planted(m):
        assert QCS.reconstruction_scale is not before
    assert QCS.reconstruction_scale is before


def test_only_counted_patches_are_accepted():
    m = Mutation("topk-best-k", "odd", "", lambda: [mock.patch.dict({}, {"a": 1})])
    with pytest.raises(TypeError, match="mock.patch of a callable"):
        with planted(m):
            pass


def _row(check: str, name: str, kind: str, killed: bool, why: str = "", caught_by: str = "") -> dict:
    return {
        "check": check,
        "mutation": name,
        "kind": kind,
        "bug": f"bug {name}",
        "verdict": "violated" if killed else "holds",
        "killed": killed,
        "measured": "",
        "calls": 3,
        "why_survives": why + (f"; caught by {caught_by}" if caught_by else ""),
        "caught_by": caught_by,
        "seconds": 0.1,
    }


def test_kill_table_reports_realistic_and_gross_rates_apart():
    df = pd.DataFrame(
        [
            _row("topk-best-k", "k+1", "realistic", True),
            _row("topk-best-k", "x1.03", "realistic", False, "too loose", "qsgd-exact"),
            _row("topk-best-k", "bottom-k", "gross", True),
            _row("topk-contraction", "k-1", "realistic", False, "loose"),
        ]
    )
    text = render(df)
    assert "1 of 3 realistic bugs killed (33%); 1 of 1 gross bugs killed (100%)" in text
    assert "| topk-best-k | 1 of 2 | 50% | 1 of 1 | 100% | yes |" in text
    assert "1 of them are killed by the exact companion named" in text
    assert "1 by no check (`topk-contraction` / `k-1`)" in text
    assert "Every patch ran (the fewest calls of any mutation's patch: 3)" in text
