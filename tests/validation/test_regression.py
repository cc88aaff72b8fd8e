"""The theory regression suite: every check of the registry run with its quick Monte Carlo size and fixed seeds
must not be violated; and for several bounds a deliberately wrong implementation must be caught.

All intervals are 99 % (analysis.measure.intervals.DEFAULT_LEVEL); the seeds are fixed, so these tests are
deterministic.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradstat.analysis.validation import registry
from gradstat.analysis.validation.checks.sidco import sidco_check

PROVENANCE = ("dump ", "synthetic: ", "constructed ")
"""Every row says what its vectors were: a dump's step/worker/block, a synthetic law, or a paper's example."""
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "samples" / "logreg-topk-ef"


@pytest.mark.parametrize("name", registry.names())
def test_check_is_not_violated(name):
    r = registry.get(name).run("quick", seed=0)
    assert r.verdict != "violated" or not r.check.must_hold, r.row()
    assert r.verdict != "not applicable", f"{name} could not run: {r.note}"
    assert r.vectors.startswith(PROVENANCE), r.vectors
    assert "_" not in r.check.source.split(" ")[0] and ".txt" not in r.check.source  # a readable citation


@pytest.mark.parametrize("name", registry.names())
def test_on_a_dump_every_row_names_its_dump_block_or_its_synthetic_law(name):
    """The sample dump (logreg, 2 steps): checks of conditional bounds run on its blocks and say which; the SIDCo
    genie checks say they are synthetic whatever the dump. One test per check (opening the dump is instant), so
    that a parallel run spreads them."""
    from gradstat.analysis.dumps import open_dump
    from gradstat.analysis.measure.sources import GradientSource

    check = registry.get(name)
    r = check.run("quick", seed=0, source=GradientSource(open_dump(SAMPLE)))
    assert r.verdict != "violated" or not check.must_hold, r.row()
    expected = "synthetic: genie" if check.name.startswith("sidco-") else "dump logreg step"
    assert r.vectors.startswith(expected), (check.name, r.vectors)


def test_qcs_with_alpha_1_1_violates_gamma_and_unbiasedness(monkeypatch):
    """QCS decoded with alpha = 1.1 instead of 1: E||e||^2 grows past gamma (10), and the projected bias is 0.1."""
    from gradstat.compressors.schemes.quantizers.qcs import QCS

    monkeypatch.setattr(QCS, "reconstruction_scale", lambda self: 1.1)
    assert registry.get("qcs-gamma").run("quick").verdict == "violated"
    r = registry.get("qcs-unbiased").run("quick")
    assert r.verdict == "violated" and r.estimate.mean == pytest.approx(0.1, abs=0.03)


def test_dqsg_without_subtracting_the_dither_violates_the_exact_variance(monkeypatch):
    """DQSG whose receiver forgets to subtract the dither (half-dithered) while claiming Lemma 3's exact variance."""
    from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer
    from gradstat.compressors.schemes.quantizers.dqsg import DQSG

    def half(self, d):
        return ScaledQuantizer(levels=self.M, bucket=d, norm="linf", subtract=False)

    monkeypatch.setattr(DQSG, "quantizer", half)
    assert registry.get("dqsg-exact").run("quick").verdict == "violated"


def test_sidco_gamma_with_the_approximate_quantile_claimed_exact_is_caught(monkeypatch):
    """SIDCo's gamma threshold computed with Cor. 1.2's approximation -beta (log delta + log Gamma(alpha)) where the
    exact quantile is claimed: k_hat/k falls far below 1 under the genie distribution."""
    import gradstat.analysis.validation.checks.sidco as checks
    import gradstat.theory.thresholds as th

    exact = th.threshold
    monkeypatch.setattr(checks, "threshold", lambda fit, ratio, quantile="exact": exact(fit, ratio, "approx"))
    r = sidco_check("gamma", "mle").run("quick")
    assert r.verdict == "violated" and r.estimate.high < 0.8


def test_topk_that_keeps_the_smallest_values_violates_the_contraction(monkeypatch):
    """A 'Top-k' that keeps the k smallest magnitudes loses more than 1 - k/d of the energy."""
    from gradstat.compressors.schemes.sparsifiers.topk import TopK

    def bottom_k(self, g, payload, ctx):
        from gradstat.compressors.schemes.sparsifiers.threshold import add_sparse

        k = max(1, round(self.ratio * g.numel()))
        add_sparse(payload, g, torch.topk(g.abs(), k, largest=False).indices)

    monkeypatch.setattr(TopK, "_encode", bottom_k)
    assert registry.get("topk-contraction").run("quick").verdict == "violated"


def test_feedback_check_catches_a_residual_that_never_decays(monkeypatch):
    """Weighted feedback with decay 1 (r_{t+1} = r_t + e_t: the residual is never spent) breaks eta (15)."""
    from gradstat.compressors.memory.feedback import ErrorFeedback

    monkeypatch.setattr(ErrorFeedback, "qcs", classmethod(lambda cls, beta: cls(beta, 1.0)))
    assert registry.get("qcs-feedback-unbiased").run("quick").verdict == "violated"


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.names())
def test_check_is_not_violated_at_full_size(name):
    """Full Monte Carlo sizes (10x the quick ones): narrower 99 % intervals, same verdict rule."""
    r = registry.get(name).run("full", seed=1)
    assert r.verdict != "violated" or not r.check.must_hold, r.row()
