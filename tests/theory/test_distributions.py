"""Sparsity-inducing distributions: agreement with scipy.stats, signed (double) forms, the torch gamma quantile,
sampling, input handling. One battery runs over every distribution (like scipy's test_continuous_basic)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import special, stats

from gradstat.theory.distributions import Double, Exponential, Gamma, GenPareto, incgamma

# (ours, scipy's frozen equivalent): scipy's gamma a = shape, genpareto c = shape (the paper's alpha), loc 0.
CASES = {
    "expon": (Exponential(2.0), stats.expon(scale=2.0)),
    "gamma_0.3": (Gamma(0.3, 1e-3), stats.gamma(0.3, scale=1e-3)),
    "gamma_0.6": (Gamma(0.6, 1.5), stats.gamma(0.6, scale=1.5)),
    "gamma_1": (Gamma(1.0, 0.5), stats.gamma(1.0, scale=0.5)),
    "gamma_4": (Gamma(4.0, 0.25), stats.gamma(4.0, scale=0.25)),
    "gp_0.2": (GenPareto(0.2, 0.7), stats.genpareto(0.2, scale=0.7)),
    "gp_0": (GenPareto(0.0, 1.3), stats.genpareto(0.0, scale=1.3)),
    "gp_-0.3": (GenPareto(-0.3, 1.0), stats.genpareto(-0.3, scale=1.0)),
    "gp_1.5": (GenPareto(1.5, 2.0), stats.genpareto(1.5, scale=2.0)),
}
PROBS = np.array([1e-300, 1e-30, 1e-12, 1e-7, 1e-4, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999999])
RTOL = 1e-9  # float64: "to float precision" up to the conditioning of the quantile near p = 1


def grid(ref) -> np.ndarray:
    """Points from the body to the far tail (sf down to ~1e-30), plus 0 and the support's end."""
    upper = ref.isf(np.array([1e-30, 1e-12, 1e-7, 1e-3, 0.1, 0.5, 0.9]))
    return np.unique(
        np.concatenate(
            [[0.0, 1e-12 * ref.std()], upper[np.isfinite(upper)], ref.mean() * np.array([0.01, 0.3, 1.0, 2.0])]
        )
    )


def assert_close(ours, ref, rtol=RTOL, atol=0.0):
    np.testing.assert_allclose(np.asarray(ours, dtype=float), ref, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ["pdf", "logpdf", "cdf", "sf"])
def test_elementwise_methods_agree_with_scipy_on_a_grid_including_tails(case, method, device):
    ours, ref = CASES[case]
    x = grid(ref)
    got = getattr(ours, method)(torch.tensor(x, device=device)).cpu().numpy()
    assert_close(got, getattr(ref, method)(x), atol=1e-300)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ["ppf", "isf"])
def test_quantiles_agree_with_scipy_including_tiny_tail_probabilities(case, method, device):
    ours, ref = CASES[case]
    got = getattr(ours, method)(torch.tensor(PROBS, device=device)).cpu().numpy()
    want = getattr(ref, method)(PROBS)
    keep = want > 1e-290  # scipy underflows to 0 for the smallest lower-tail quantiles of small shapes
    assert_close(got[keep], want[keep])


@pytest.mark.parametrize("case", CASES)
def test_mean_and_variance_agree_with_scipy(case):
    ours, ref = CASES[case]
    assert ours.mean() == pytest.approx(ref.mean(), rel=1e-12)
    if case == "gp_1.5":  # shape >= 1: infinite mean; scipy reports the variance as nan, here it is inf
        assert math.isinf(ours.var())
        return
    assert ours.var() == pytest.approx(ref.var(), rel=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_ppf_inverts_cdf_and_isf_inverts_sf(case):
    ours, _ = CASES[case]
    p = np.array([1e-9, 0.2, 0.5, 0.8])
    assert_close(ours.cdf(ours.ppf(p)), p, rtol=1e-9)
    assert_close(ours.sf(ours.isf(p)), p, rtol=1e-9)


def test_outside_the_support_and_outside_0_1():
    for dist in (Exponential(1.0), Gamma(0.5, 1.0), GenPareto(0.3, 1.0)):
        x = np.array([-2.0, -1e-9])
        assert np.all(dist.pdf(x) == 0) and np.all(dist.cdf(x) == 0) and np.all(dist.sf(x) == 1)
        assert np.all(np.isneginf(dist.logpdf(x)))
        assert np.all(np.isnan(dist.ppf(np.array([-0.1, 1.1])))) and np.all(np.isnan(dist.isf(np.array([2.0]))))
        assert dist.ppf(0.0) == 0 and math.isinf(dist.ppf(1.0)) and math.isinf(dist.isf(0.0)) and dist.isf(1.0) == 0
    bounded = GenPareto(-0.5, 1.0)  # support [0, 2]
    assert bounded.pdf(2.5) == 0 and bounded.cdf(2.5) == 1 and bounded.sf(3.0) == 0
    assert bounded.isf(0.0) == pytest.approx(2.0)


def test_nan_input_gives_nan():
    for method in ("pdf", "logpdf", "cdf", "sf", "ppf", "isf"):
        assert np.isnan(getattr(Gamma(0.5, 1.0), method)(np.array([np.nan])))[0]


def test_numpy_in_numpy_out_torch_in_torch_out_keeping_dtype_and_device(device):
    dist = Gamma(0.5, 2.0)
    out = dist.cdf(np.array([0.5, 1.0]))
    assert isinstance(out, np.ndarray)
    x = torch.tensor([0.5, 1.0], device=device, dtype=torch.float32)
    t = dist.isf(x * 0.1)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == device.type


def test_float32_quantiles_are_accurate_to_float32_precision(device):
    q = torch.tensor([1e-7, 1e-4, 0.01, 0.3], device=device, dtype=torch.float32)
    for a in (0.3, 0.6, 3.0):
        got = Gamma(a, 1.0).isf(q).cpu().double().numpy()
        assert_close(got, stats.gamma(a).isf(q.cpu().double().numpy()), rtol=1e-5)


def test_tensor_parameters_broadcast_and_stay_on_device(device):
    shape = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64, device=device)
    dist = Gamma(shape, torch.tensor(2.0, dtype=torch.float64, device=device))
    got = dist.isf(torch.tensor(1e-3, dtype=torch.float64, device=device))
    assert got.shape == (3,) and got.device.type == device.type
    assert_close(got.cpu().numpy(), stats.gamma([0.3, 0.6, 0.9], scale=2.0).isf(1e-3))
    assert torch.allclose(dist.mean().cpu(), torch.tensor([0.6, 1.2, 1.8], dtype=torch.float64))


@pytest.mark.parametrize(
    "bad, error",
    [(0.0, ValueError), (-1.0, ValueError), (math.nan, ValueError), (math.inf, ValueError), ("1", TypeError)],
)
def test_invalid_parameters_are_rejected_naming_them(bad, error):
    with pytest.raises(error, match="scale"):
        Exponential(bad)
    with pytest.raises(error, match="shape"):
        Gamma(bad, 1.0)


def test_generalized_pareto_accepts_any_finite_shape_but_not_nan():
    GenPareto(-0.4, 1.0)
    with pytest.raises(ValueError, match="shape"):
        GenPareto(math.nan, 1.0)


# ---- signed forms -------------------------------------------------------------------------------------------------
DOUBLE_CASES = {
    "laplace": (Double(Exponential(1.5)), stats.laplace(scale=1.5)),
    "dgamma_0.4": (Double(Gamma(0.4, 2.0)), stats.dgamma(0.4, scale=2.0)),
    "dgamma_2": (Double(Gamma(2.0, 0.5)), stats.dgamma(2.0, scale=0.5)),
}


@pytest.mark.parametrize("case", DOUBLE_CASES)
@pytest.mark.parametrize("method", ["pdf", "logpdf", "cdf", "sf"])
def test_double_forms_agree_with_scipy_laplace_and_dgamma(case, method):
    ours, ref = DOUBLE_CASES[case]
    x = np.array([-30.0, -3.0, -0.5, -1e-6, 1e-6, 0.5, 3.0, 30.0])
    assert_close(getattr(ours, method)(x), getattr(ref, method)(x), atol=1e-300)


@pytest.mark.parametrize("case", DOUBLE_CASES)
def test_double_quantiles_agree_with_scipy_and_have_the_right_sign(case):
    ours, ref = DOUBLE_CASES[case]
    p = np.array([1e-9, 1e-3, 0.2, 0.7, 0.999])
    assert_close(ours.ppf(p), ref.ppf(p), rtol=1e-8)
    assert_close(ours.isf(p), ref.isf(p), rtol=1e-8)
    assert np.all(ours.ppf(p[p < 0.5]) < 0) and np.all(ours.ppf(p[p > 0.5]) > 0)
    assert ours.ppf(0.5) == 0


def test_double_generalized_pareto_follows_sidco_30():
    """f_G(g) = (1/(2 beta)) (1 + alpha |g| / beta)^-(1/alpha + 1), SIDCo (30), computed independently here."""
    alpha, beta = 0.3, 0.8
    g = np.array([-5.0, -0.2, 0.0, 0.2, 5.0])
    want = (1 / (2 * beta)) * (1 + alpha * np.abs(g) / beta) ** (-(1 / alpha + 1))
    dist = Double(GenPareto(alpha, beta))
    assert_close(dist.pdf(g), want)
    assert_close(
        dist.cdf(g),
        np.where(
            g < 0, 0.5 * stats.genpareto(alpha, scale=beta).sf(-g), 1 - 0.5 * stats.genpareto(alpha, scale=beta).sf(g)
        ),
    )


@pytest.mark.parametrize("dist", [Exponential(1.0), Gamma(0.5, 1.0), GenPareto(0.2, 1.0)])
def test_lemma_1_two_sided_quantile_equals_magnitude_quantile(dist):
    """SIDCo Lemma 1: F_G^{-1}(1 - delta/2) = F_|G|^{-1}(1 - delta) = isf_|G|(delta)."""
    for delta in (0.1, 1e-3, 1e-6):
        assert Double(dist).ppf(1 - delta / 2) == pytest.approx(dist.isf(delta), rel=1e-8)


def test_double_mean_is_zero_and_variance_is_second_moment():
    assert Double(Gamma(0.5, 2.0)).mean() == 0
    assert Double(Gamma(0.5, 2.0)).var() == pytest.approx(stats.dgamma(0.5, scale=2.0).var())
    with pytest.raises(TypeError, match="dist"):
        Double(stats.norm())


# ---- torch gamma quantile -----------------------------------------------------------------------------------------
# a over seven decades; p from 1e-300 through the body to 1 - 1e-12. Before the bound below the root and the underflow
# term with its e^-x, the lower branch missed by up to 5x at a >= 400, p <= 1e-295 and by 0.9 at a = 10.4, p = 5e-22.
A_GRID = np.logspace(-3, 4, 57)
P_GRID = np.concatenate(
    [10.0 ** -np.linspace(300, 1, 60), np.linspace(0.05, 0.95, 19), 1 - 10.0 ** -np.linspace(2, 12, 11)]
)


def worst_relative_error_of_gamma_inverses() -> float:
    a, p = (torch.tensor(v) for v in np.meshgrid(A_GRID, P_GRID))
    worst = 0.0
    for ours, ref in ((incgamma.gammaincinv, special.gammaincinv), (incgamma.gammainccinv, special.gammainccinv)):
        want = ref(a.numpy(), p.numpy())
        got = ours(a, p).numpy()
        keep = want > 1e-290
        worst = max(worst, float(np.max(np.abs(got[keep] / want[keep] - 1))))
    return worst


def test_torch_gamma_inverses_agree_with_scipy_to_1e9_from_1e300_to_1():
    assert worst_relative_error_of_gamma_inverses() < 1e-9


def test_fewer_steps_than_documented_are_detected(monkeypatch):
    """The check above fails on a deliberately truncated solver (2 Halley steps instead of STEPS)."""
    monkeypatch.setattr(incgamma, "STEPS", 2)
    assert worst_relative_error_of_gamma_inverses() > 1e-6


Q_MODERATE = np.concatenate([np.logspace(-6, np.log10(0.99), 60), 1 - 10.0 ** -np.linspace(2, 16, 15)])
"""q from incgamma.MODERATE up: what SIDCo's gamma first stage asks (q >= delta_1), to 1 - 1e-16."""


def worst_relative_error_of_the_moderate_solver() -> float:
    a, q = (torch.tensor(v) for v in np.meshgrid(A_GRID, Q_MODERATE))
    want = special.gammainccinv(a.numpy(), q.numpy())
    got = incgamma.gammainccinv(a, q, q_at_least=incgamma.MODERATE).numpy()
    keep = want > 1e-290
    return float(np.max(np.abs(got[keep] / want[keep] - 1)))


def test_a_q_known_to_be_moderate_takes_fewer_steps_to_the_same_accuracy(monkeypatch):
    assert incgamma.MODERATE_STEPS < incgamma.STEPS
    assert worst_relative_error_of_the_moderate_solver() < 1e-9
    monkeypatch.setattr(incgamma, "MODERATE_STEPS", 1)  # (a truncated solver: the check above fails on it)
    assert worst_relative_error_of_the_moderate_solver() > 1e-6
    monkeypatch.setattr(incgamma, "MODERATE_STEPS", 99)  # (the bound is what chooses the count)
    calls = []
    monkeypatch.setattr(incgamma, "host_form", lambda a, prob: False)  # (the torch solver, not scipy's host form)
    monkeypatch.setattr(incgamma, "_solve", lambda a, logp, logq, steps=None: calls.append(steps) or logp)
    incgamma.gammainccinv(torch.tensor([0.5]), torch.tensor([0.3]), q_at_least=0.25)
    incgamma.gammainccinv(torch.tensor([0.5]), torch.tensor([0.3]), q_at_least=1e-7)
    assert calls == [99, None]


def test_the_solver_at_single_points_on_each_device(device, monkeypatch):
    """SIDCo's use: one value of each argument, on the device, in the far tail and the body (the torch solver on a
    CPU too, not scipy's host form)."""
    monkeypatch.setattr(incgamma, "host_form", lambda a, prob: False)
    for a, q in ((0.3, 1e-3), (0.05, 1e-7), (2.5, 0.4), (40.0, 1e-30)):
        at = torch.tensor(a, dtype=torch.float64, device=device)
        qt = torch.tensor(q, dtype=torch.float64, device=device)
        got = incgamma.gammainccinv(at, qt)
        assert got.device == qt.device
        assert float(got) == pytest.approx(special.gammainccinv(a, q), rel=1e-9)


def test_gamma_inverse_edge_probabilities():
    a = torch.tensor(0.5, dtype=torch.float64)
    p = torch.tensor([0.0, 1.0, -0.5, 1.5, math.nan], dtype=torch.float64)
    got = incgamma.gammaincinv(a, p)
    assert got[0] == 0 and math.isinf(got[1]) and torch.isnan(got[2:]).all()
    got = incgamma.gammainccinv(a, p)
    assert math.isinf(got[0]) and got[1] == 0 and torch.isnan(got[2:]).all()


# ---- sampling -----------------------------------------------------------------------------------------------------
KS_LEVEL = 1e-3  # Kolmogorov-Smirnov test at the 0.1 % level with a fixed seed


def ks_pvalue(sample: torch.Tensor, ref) -> float:
    return stats.kstest(sample.cpu().numpy(), ref.cdf).pvalue


@pytest.mark.parametrize("case", ["expon", "gamma_0.3", "gamma_0.6", "gamma_4", "gp_0.2", "gp_-0.3"])
def test_samples_follow_the_distribution_ks_test(case, device):
    ours, ref = CASES[case]
    gen = torch.Generator(device=device).manual_seed(1234)
    sample = ours.sample(20000, gen)
    assert sample.shape == (20000,) and sample.device.type == device.type and sample.dtype == torch.float64
    assert ks_pvalue(sample, ref) > KS_LEVEL


def test_ks_check_detects_a_wrong_sampler():
    """Samples of gamma(0.55) are rejected as gamma(0.6): the KS check above can fail."""
    sample = Gamma(0.55, 1.5).sample(20000, torch.Generator().manual_seed(1234))
    assert ks_pvalue(sample, stats.gamma(0.6, scale=1.5)) < KS_LEVEL


def test_double_samples_are_symmetric_with_the_right_magnitudes():
    sample = Double(Gamma(0.6, 1.5)).sample(20000, torch.Generator().manual_seed(7))
    assert stats.kstest(sample.numpy(), stats.dgamma(0.6, scale=1.5).cdf).pvalue > KS_LEVEL


def test_sampling_is_reproducible_from_the_generator_and_leaves_global_rng_alone():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = Gamma(0.4, 1.0).sample(1000, torch.Generator().manual_seed(3))
    b = Gamma(0.4, 1.0).sample(1000, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(before, torch.get_rng_state())


def test_sample_rejects_bad_sizes_and_vector_parameters():
    with pytest.raises(ValueError, match="n must"):
        Exponential(1.0).sample(-1)
    with pytest.raises(ValueError, match="scalar"):
        Gamma(torch.tensor([0.5, 0.6]), 1.0).sample(10)


def test_half_precision_input_is_evaluated_in_float32():
    x = torch.tensor([0.5, 2.0], dtype=torch.bfloat16)
    got = Gamma(0.5, 1.0).sf(x)
    assert got.dtype == torch.float32
    assert_close(got.double().numpy(), stats.gamma(0.5).sf(x.double().numpy()), rtol=1e-6)


def test_the_host_form_of_one_value_on_a_cpu_agrees_with_the_torch_solver():
    """One value on a CPU: the quantile comes from scipy on host floats (incgamma.host_form); it agrees with the
    torch solver (the reference, the policy ``never``) to 1e-9 relative over the whole grid, both inverses."""
    from gradstat.theory.kernels.policy import forced

    worst = 0.0
    for ours in (incgamma.gammaincinv, incgamma.gammainccinv):
        for a in A_GRID:
            for p in P_GRID:
                at, pt = torch.tensor(a, dtype=torch.float64), torch.tensor(p, dtype=torch.float64)
                assert incgamma.host_form(at, pt)
                host = float(ours(at, pt))
                with forced("never"):
                    assert not incgamma.host_form(at, pt)
                    solved = float(ours(at, pt))
                if solved > 1e-290:
                    worst = max(worst, abs(host / solved - 1))
    assert worst < 1e-9
