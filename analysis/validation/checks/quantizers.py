"""Checks of the quantizers' variance claims: QCS (000), DQSG and its half-dithered form (002), QSGD."""

from __future__ import annotations

import torch

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.studies.variance import bias_samples
from gradstat.analysis.validation.checks.common import block, create, variance_check
from gradstat.analysis.validation.engine import Check, Measurement, Setting

QCS = "000_4b111efa75352b2d.txt"
DQSG = "002_87c17e3716ede1d0.txt"
N_QCS = 256
QCS_UNBIASED = f"qcs:block={N_QCS},k=64,Q=4,alpha=unbiased"
QCS_MMSE = f"qcs:block={N_QCS},k=64,Q=4,alpha=mmse"


def _qcs_unbiased(s: Setting) -> Measurement:
    """Projected bias <g_hat - g, g>/||g||^2 of unbiased QCS; 0 in expectation (eq. (9))."""
    comp = create(QCS_UNBIASED)
    g = block(s, N_QCS)
    return Measurement(0.0, mean_ci(bias_samples(comp, g, s.trials, s.seed)), f"{QCS_UNBIASED}; direction g")


def _lemma1(s: Setting) -> Measurement:
    """E[T^T T] = I: the mean of ||T x||^2 / ||x||^2 over the random signs r is 1 (Lemma 1, eq. (3)); the note
    gives max |T T^T - (n/k) I| for one draw (exact identity)."""
    from gradstat.compressors.qcs import mix, rademacher, unmix

    k = 64
    x = block(s, N_QCS).double()[None, :]
    samples = []
    for t in range(s.trials):
        r = rademacher((1, N_QCS), s.seed * 1_000_003 + t, s.device).double()
        samples.append(float(mix(x, r, k).square().sum() / x.square().sum()))
    r = rademacher((k, N_QCS), s.seed, s.device).double()[:1].expand(k, N_QCS)
    ttt = mix(unmix(torch.eye(k, dtype=torch.float64, device=s.device), r), r, k)  # rows: T T^T e_j
    dev = float((ttt - (N_QCS / k) * torch.eye(k, dtype=torch.float64, device=s.device)).abs().max())
    return Measurement(1.0, mean_ci(samples), f"n={N_QCS}, k={k}; max |T T^T - (n/k) I| = {dev:.1e}")


CHECKS = [
    variance_check("qcs-gamma", QCS_UNBIASED, N_QCS, "upper", f"{QCS} Thm 2 eq. (10)", 300, 3000),
    variance_check("qcs-mmse", QCS_MMSE, N_QCS, "upper", f"{QCS} Lemma 3 eq. (13)", 300, 3000),
    Check(
        "qcs-unbiased",
        f"{QCS} eq. (9), Thm 2",
        "equal",
        "E<g_hat - g, g> / ||g||^2",
        _qcs_unbiased,
        {"quick": 300, "full": 3000},
    ),
    Check(
        "qcs-lemma1",
        f"{QCS} Lemma 1 eq. (3)",
        "equal",
        "E||T x||^2 / ||x||^2 (= x^T E[T^T T] x / ||x||^2)",
        _lemma1,
        {"quick": 300, "full": 3000},
    ),
    variance_check("dqsg-exact", "dqsg:M=4", 1024, "equal", f"{DQSG} Lemma 3 / App. B", 300, 3000),
    variance_check("half-dither-exact", "dqsg:M=4,half=true", 1024, "equal", f"{DQSG} Sec. 2.1.1, Lemma 2", 300, 3000),
    variance_check(
        "qsgd-bound",
        "qsgd:s=4,bucket=512",
        1024,
        "upper",
        "Alistarh et al. 2017 Lemma 3.1 (000 Fig. 3; 002 Lemma 2)",
        300,
        3000,
    ),
]
