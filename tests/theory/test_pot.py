"""Multi-stage peak over threshold (SIDCo Sec. 2.4, Lemma 2, Cor. 2.1): stage ratios, the stage arithmetic against
an independent numpy transcription of (7)-(11), k_hat/k on Laplace and gamma(0.5) samples, anchors, zeros,
degenerate stages, errors, and a check that detects a wrong implementation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from gradstat.theory.distributions import Exponential, Gamma
from gradstat.theory.estimators.exceedances import Exceedances
from gradstat.theory.pot import PotResult, multistage_threshold, stage_ratios

TOLERANCE = 0.2  # SIDCo's stage-adaptation tolerance eps = 20 % (Sec. 4, (12)): |k_hat/k - 1| <= eps


# ---- stage ratios -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, stages", [(0.1, 2), (1e-3, 3), (1e-4, 5)])
def test_stage_ratios_start_at_first_ratio_split_the_rest_equally_and_multiply_to_the_target(ratio, stages):
    deltas = stage_ratios(ratio, stages)
    assert len(deltas) == stages and deltas[0] == 0.25
    assert math.prod(deltas) == pytest.approx(ratio, rel=1e-12)
    assert all(d == pytest.approx(deltas[1], rel=1e-12) for d in deltas[1:])


def test_one_stage_is_the_target_ratio():
    assert stage_ratios(0.3, 1) == [0.3]
    assert stage_ratios(0.01, 2, first_ratio=0.1) == pytest.approx([0.1, 0.1])


@pytest.mark.parametrize(
    "args, match",
    [
        ((0.0, 2), "ratio"),
        ((0.01, 0), "stages"),
        ((0.01, 1.5), "stages"),
        ((0.3, 2), "below first_ratio"),
        ((0.01, 2, 1.0), "first_ratio"),
    ],
)
def test_stage_ratio_errors(args, match):
    with pytest.raises(ValueError, match=match):
        stage_ratios(*args)


# ---- arithmetic of the stages against an independent transcription ------------------------------------------------
def numpy_pot(x: np.ndarray, deltas: list[float], first: str, later: str, anchor: str) -> list[float]:
    """Direct transcription of SIDCo (6), (28)-(29) for stage 1 and (7)-(11) for later stages, in numpy."""
    etas = []
    if first == "exponential":
        eta = x.mean() * math.log(1 / deltas[0])  # (6)
    else:
        mu, var = x.mean(), x.var(ddof=1)
        a, b = 0.5 * (1 - mu**2 / var), 0.5 * mu * (mu**2 / var + 1)  # (29)
        eta = b / a * (math.exp(-a * math.log(deltas[0])) - 1)  # (28)
    etas.append(eta)
    for delta in deltas[1:]:
        bar = x[x > eta]
        shift = eta if anchor == "threshold" else bar.min()
        y = bar - shift
        if later == "exponential":
            eta = y.mean() * math.log(1 / delta) + shift  # (10)-(11)
        else:
            mu, var = y.mean(), y.var(ddof=1)
            a, b = 0.5 * (1 - mu**2 / var), 0.5 * mu * (mu**2 / var + 1)  # (8)-(9)
            eta = b / a * (math.exp(-a * math.log(delta)) - 1) + shift  # (7)
        etas.append(eta)
    return etas


@pytest.mark.parametrize(
    "first, later", [("exponential", "exponential"), ("genpareto", "genpareto"), ("exponential", "genpareto")]
)
@pytest.mark.parametrize("anchor", ["threshold", "min_survivor"])
def test_stage_thresholds_follow_lemma_2_and_corollary_2_1(first, later, anchor, device):
    x = Gamma(0.5, 1.0).sample(200_000, torch.Generator().manual_seed(0))
    result = multistage_threshold(x.to(device), 1e-3, 3, first=first, later=later, anchor=anchor)
    want = numpy_pot(x.numpy(), stage_ratios(1e-3, 3), first, later, anchor)
    assert result.stopped_reason is None and len(result.stages) == 3
    assert [float(s.threshold) for s in result.stages] == pytest.approx(want, rel=1e-9)
    assert float(result.threshold) == pytest.approx(want[-1], rel=1e-9)
    for stage, eta in zip(result.stages, want, strict=True):
        assert int(stage.survivors) == int((x.numpy() > eta).sum())
        assert stage.survivors.dtype == torch.int64 and stage.threshold.device.type == device.type
    assert result.stages[1].fit.n == int((x.numpy() > want[0]).sum())


def test_gamma_first_stage_uses_the_gamma_quantile_then_generalized_pareto():
    x = Gamma(0.5, 1.0).sample(100_000, torch.Generator().manual_seed(1))
    result = multistage_threshold(x, 1e-3, 2, first="gamma")
    first = result.stages[0].fit
    assert first.dist == "gamma" and result.stages[1].fit.dist == "genpareto"
    a, b = float(first.params["shape"]), float(first.params["scale"])
    assert float(result.stages[0].threshold) == pytest.approx(stats.gamma(a, scale=b).isf(0.25), rel=1e-9)
    approx = multistage_threshold(x, 1e-3, 2, first="gamma", quantile="approx")
    assert float(approx.stages[0].threshold) == pytest.approx(-b * (math.log(0.25) + math.lgamma(a)), rel=1e-9)


def test_explicit_ratios_are_used():
    x = Exponential(1.0).sample(50_000, torch.Generator().manual_seed(2))
    result = multistage_threshold(x, 0.01, 2, ratios=[0.1, 0.1])
    assert [s.ratio for s in result.stages] == [0.1, 0.1]
    with pytest.raises(ValueError, match="product"):
        multistage_threshold(x, 0.01, 2, ratios=[0.1, 0.2])
    with pytest.raises(ValueError, match="one ratio per stage"):
        multistage_threshold(x, 0.01, 3, ratios=[0.1, 0.1])


# ---- realized ratio on Laplace and gamma(0.5) samples --------------------------------------------------------------
def khat_over_k(sample_of, ratio: float, stages: int, first: str, seeds=range(3), d: int = 2**18, **kw) -> list:
    out = []
    for seed in seeds:
        x = sample_of(d, seed)
        result = multistage_threshold(x, ratio, stages, first=first, **kw)
        out.append(int((x > result.threshold).sum()) / (ratio * d))
    return out


def laplace(d: int, seed: int) -> torch.Tensor:
    return Exponential(1.0).sample(d, torch.Generator().manual_seed(seed), dtype=torch.float32)


def gamma_half(d: int, seed: int) -> torch.Tensor:
    return Gamma(0.5, 1.0).sample(d, torch.Generator().manual_seed(seed), dtype=torch.float32)


@pytest.mark.parametrize("first, stages", [("exponential", 3), ("gamma", 3), ("genpareto", 3)])
def test_pot_on_laplace_samples_reaches_the_target_ratio(first, stages):
    assert all(abs(r - 1) <= TOLERANCE for r in khat_over_k(laplace, 1e-3, stages, first))


@pytest.mark.parametrize("first, stages", [("exponential", 4), ("gamma", 3), ("genpareto", 3)])
def test_pot_on_gamma_half_samples_reaches_the_target_ratio(first, stages):
    assert all(abs(r - 1) <= TOLERANCE for r in khat_over_k(gamma_half, 1e-3, stages, first))


def test_the_ratio_check_detects_single_stage_exponential_on_gamma_half():
    """Why PoT exists (SIDCo Sec. 2.3, 'far tail fitting'): one exponential stage on gamma(0.5) magnitudes keeps
    about 8.5 times too many elements at delta = 1e-3, and the check above fails on it."""
    ratios = khat_over_k(gamma_half, 1e-3, 1, "exponential")
    assert all(r > 5 for r in ratios)


def test_the_ratio_check_detects_stages_that_forget_the_shift(monkeypatch):
    """A deliberately wrong PoT that fits the exceedances without subtracting eta_{m-1} (so the fitted law
    describes |g| rather than |g| - eta_{m-1}) misses the target. (The eager path's shift; the fused kernel's is
    planted in tests/theory/test_fused.py.)"""
    monkeypatch.setenv("GRADSTAT_COMPILE", "never")
    monkeypatch.setattr(
        Exceedances,
        "_shifted",
        lambda self: self.x if self.above is None else torch.where(self.x > self.above, self.x, 0),
    )
    ratios = khat_over_k(laplace, 1e-3, 3, "exponential", seeds=range(1))
    assert all(abs(r - 1) > TOLERANCE for r in ratios)


def test_anchor_at_smallest_survivor_also_reaches_the_target():
    assert all(abs(r - 1) <= TOLERANCE for r in khat_over_k(gamma_half, 1e-3, 3, "gamma", anchor="min_survivor"))


def test_mle_stages_also_reach_the_target():
    assert all(abs(r - 1) <= TOLERANCE for r in khat_over_k(gamma_half, 1e-3, 3, "gamma", seeds=range(1), method="mle"))


# ---- zeros --------------------------------------------------------------------------------------------------------
def test_zeros_count_toward_the_whole_vector():
    """90 % exact zeros: the stage-1 ratio is conditional on the non-zeros, so the final count is near delta d."""
    d, ratio = 2**20, 1e-3
    nonzero = laplace(d // 10, 4)
    x = torch.cat([nonzero, torch.zeros(d - nonzero.numel())])
    result = multistage_threshold(x, ratio, 2)
    assert result.stages[0].fit.n_zeros == d - nonzero.numel()
    assert abs(int((x > result.threshold).sum()) / (ratio * d) - 1) <= TOLERANCE


def test_first_stage_needing_more_than_the_non_zeros_gives_threshold_zero_with_a_warning():
    x = torch.cat([torch.rand(100) + 0.5, torch.zeros(900)])
    result = multistage_threshold(x, 0.01, 2, first_ratio=0.25)
    assert float(result.stages[0].threshold) == 0.0
    assert any("threshold 0" in w for w in result.stages[0].fit.warnings)
    assert int(result.stages[0].survivors) == 100


# ---- degenerate stages --------------------------------------------------------------------------------------------
def assert_clean(result: PotResult) -> None:
    assert torch.isfinite(result.threshold)
    for stage in result.stages:
        assert torch.isfinite(stage.threshold)
        assert all(torch.isfinite(v) for v in stage.fit.params.values())


@pytest.mark.parametrize("method", ["closed_form", "mle"])
@pytest.mark.parametrize("later", ["exponential", "genpareto"])
def test_no_survivor_keeps_the_previous_threshold_and_says_why(method, later):
    x = torch.full((1000,), 0.5)  # exponential stage 1: eta_1 = 0.5 log 4 > 0.5, nothing survives
    result = multistage_threshold(x, 0.01, 3, later=later, method=method)
    assert_clean(result)
    assert len(result.stages) == 1 and "stage 2: no survivor" in result.stopped_reason
    assert float(result.threshold) == pytest.approx(0.5 * math.log(4))


@pytest.mark.parametrize("method", ["closed_form", "mle"])
def test_one_survivor_keeps_the_previous_threshold_and_says_why(method):
    x = torch.cat([torch.full((999,), 0.1), torch.tensor([50.0])])
    result = multistage_threshold(x, 0.01, 3, later="genpareto", method=method)
    assert_clean(result)
    assert len(result.stages) == 1 and "stage 2: one survivor" in result.stopped_reason
    assert float(result.threshold) == float(result.stages[0].threshold)


def test_zero_variance_exceedances_stop_cleanly():
    x = torch.cat([torch.full((990,), 0.1), torch.full((10,), 7.0)])
    result = multistage_threshold(x, 0.01, 3, later="genpareto")
    assert_clean(result)
    assert "stage 2: degenerate fit" in result.stopped_reason and len(result.stages) == 1


def test_later_stage_can_stop_after_earlier_ones_completed():
    x = torch.cat([laplace(10_000, 5), torch.tensor([1e6])])  # far outlier: late stages run out of survivors
    result = multistage_threshold(x, 1e-4, 6, first_ratio=0.25)
    assert_clean(result)
    if result.stopped_reason is not None:
        m = len(result.stages)
        assert result.stopped_reason.startswith(f"stage {m + 1}:")
        assert float(result.threshold) == float(result.stages[-1].threshold)


# ---- errors -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(first="laplace"), "first must be one of"),
        (dict(later="gamma"), "later must be one of"),
        (dict(anchor="median"), "anchor must be one of"),
        (dict(quantile="x"), "quantile must be one of"),
        (dict(method="newton"), "method"),
        (dict(ratio=1.0), "ratio"),
        (dict(stages=0), "stages"),
    ],
)
def test_invalid_arguments_are_rejected(kwargs, match):
    args = dict(abs_g=torch.rand(10_000), ratio=0.01, stages=2) | kwargs
    with pytest.raises(ValueError, match=match):
        multistage_threshold(**args)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.tensor([]), "empty"),
        (torch.zeros(100), "all zeros"),
        (torch.tensor([1.0, -1.0] * 100), r"\|g\|"),
        (torch.tensor([1.0, math.nan] * 100), "NaN"),
    ],
)
def test_invalid_input_is_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        multistage_threshold(bad, 0.01, 2)


def test_vector_shorter_than_one_over_ratio_is_rejected():
    with pytest.raises(ValueError, match="1/ratio"):
        multistage_threshold(torch.rand(99), 0.01, 2)
