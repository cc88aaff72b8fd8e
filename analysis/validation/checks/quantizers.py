"""Checks of the quantizers' variance claims: QCS (Abdi & Fekri, Quantized Compressive Sampling), DQSG and its
half-dithered form (Abdi & Fekri, Nested Dithered Quantization), QSGD (Alistarh et al.)."""

from __future__ import annotations

import torch

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.studies.variance import bias_samples
from gradstat.analysis.validation.checks.common import block, create, origin, variance_check
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.theory.sources import cite, file_of

QCS = "QCS"
DQSG = "DQSG"
N_QCS = 256
QCS_UNBIASED = f"qcs:block={N_QCS},k=64,Q=4,alpha=unbiased"
QCS_MMSE = f"qcs:block={N_QCS},k=64,Q=4,alpha=mmse"


def _qcs_unbiased(s: Setting) -> Measurement:
    """Projected bias <g_hat - g, g>/||g||^2 of unbiased QCS; 0 in expectation (eq. (9))."""
    comp = create(QCS_UNBIASED)
    g = block(s, N_QCS)
    return Measurement(
        0.0,
        mean_ci(bias_samples(comp, g, s.trials, s.seed)),
        f"{QCS_UNBIASED}; direction g",
        origin(s, N_QCS),
        setup={"compressor": QCS_UNBIASED, "n": N_QCS},
    )


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
    return Measurement(
        1.0,
        mean_ci(samples),
        f"n={N_QCS}, k={k}; max |T T^T - (n/k) I| = {dev:.1e}",
        origin(s, N_QCS),
        setup={"n": N_QCS, "k": k},
    )


CHECKS = [
    variance_check("qcs-gamma", QCS_UNBIASED, N_QCS, "upper", QCS, "Thm 2 eq. (10)", 300, 3000),
    variance_check("qcs-mmse", QCS_MMSE, N_QCS, "upper", QCS, "Lemma 3 eq. (13)", 300, 3000),
    Check(
        "qcs-unbiased",
        cite(QCS, "eq. (9), Thm 2"),
        "equal",
        "E<g_hat - g, g> / ||g||^2",
        _qcs_unbiased,
        {"quick": 300, "full": 3000},
        paper=file_of(QCS),
    ),
    Check(
        "qcs-lemma1",
        cite(QCS, "Lemma 1 eq. (3)"),
        "equal",
        "E||T x||^2 / ||x||^2 (= x^T E[T^T T] x / ||x||^2)",
        _lemma1,
        {"quick": 300, "full": 3000},
        paper=file_of(QCS),
    ),
    variance_check("dqsg-exact", "dqsg:M=4", 1024, "equal", DQSG, "Lemma 3 / App. B", 300, 3000),
    variance_check(
        "half-dither-exact", "dqsg:M=4,half=true", 1024, "equal", DQSG, "Sec. 2.1.1, Lemma 2", 300, 3000
    ),
    variance_check("qsgd-bound", "qsgd:s=4,bucket=512", 1024, "upper", "QSGD", "Lemma 3.1", 300, 3000),
]
