"""Checks of the quantizers' variance claims: QCS (Abdi & Fekri, Quantized Compressive Sampling), DQSG and its
half-dithered form (Abdi & Fekri, Nested Dithered Quantization), QSGD (Alistarh et al.)."""

from __future__ import annotations

import torch

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.studies.variance import bias_samples, error_samples
from gradstat.analysis.validation.checks.common import block, create, origin, paired, variance_check
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.compressors import Context
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
    gives max |T T^T - (n/k) I| for one draw (exact identity). The signs are the default QCS's (counter-based)."""
    from gradstat.compressors.schemes.quantizers.qcs import mix, signs, unmix

    k = 64
    x = block(s, N_QCS).double()[None, :]
    samples = []
    for t in range(s.trials):
        r = signs((1, N_QCS), s.seed * 1_000_003 + t, s.device).double()
        samples.append(float(mix(x, r, k).square().sum() / x.square().sum()))
    r = signs((k, N_QCS), s.seed, s.device).double()[:1].expand(k, N_QCS)
    ttt = mix(unmix(torch.eye(k, dtype=torch.float64, device=s.device), r), r, k)  # rows: T T^T e_j
    dev = float((ttt - (N_QCS / k) * torch.eye(k, dtype=torch.float64, device=s.device)).abs().max())
    return Measurement(
        1.0,
        mean_ci(samples),
        f"n={N_QCS}, k={k}; max |T T^T - (n/k) I| = {dev:.1e}",
        origin(s, N_QCS),
        setup={"n": N_QCS, "k": k},
    )


QCS2 = f"qcs:block={N_QCS},k={N_QCS},Q=1"


def _qcs_dither_exact(s: Setting) -> Measurement:
    """QCS-2 (k = n, Q = 1; QCS Sec. 6): T is orthogonal, so the whole error is the dithered quantization of
    v = T g. Without overload (|v/s| <= Q) each element's error is uniform over one step s/Q and independent of v
    (Theorem 1 of the dithered quantizer, eq. (4)-(6)), and T^T keeps its energy: given the sent scale s,
    ``E[||g_hat - g||^2 | s] = n (s/Q)^2 / 12`` per block. Paired per trial against the scale the payload carries."""
    comp = create(QCS2)
    g = block(s, N_QCS)
    gg = float(g.double().square().sum())
    measured, exact = [], []
    for t in range(s.trials):
        ctx = Context(seed=s.seed, step=t)
        payload = comp.encode(g, ctx)
        scale = payload["scales"].double()
        measured.append(float((comp.decode(payload, ctx).double() - g.double()).square().sum()) / gg)
        exact.append(float((N_QCS * scale.square() / 12.0).sum()) / gg)
    theory, est, _ = paired(measured, exact)
    return Measurement(
        theory,
        est,
        f"{QCS2} (QCS-2); reference: n (s/Q)^2 / 12 per block with the sent scale s = ||T g||_inf; interval of the "
        "paired difference",
        origin(s, N_QCS),
        setup={"compressor": QCS2, "n": N_QCS},
    )


QSGD_SPEC = "qsgd:s=4,bucket=512"
N_QSGD = 1024


def _qsgd_exact(s: Setting) -> Measurement:
    """QSGD's error against its exact conditional variance: per bucket of 512, ``sum_i Var[Q_s(v_i)]`` with the
    bucket's l2 norm as the scale (:func:`gradstat.theory.qsgd.total_variance`, computed in float64 from the
    vector, independently of the compressor), over ``||g||^2``."""
    import numpy as np

    from gradstat.theory.qsgd import total_variance

    comp = create(QSGD_SPEC)
    g = block(s, N_QSGD)
    x = g.double().cpu().numpy()
    exact = sum(total_variance(b, 4, "l2") for b in np.split(x, N_QSGD // 512) if np.any(b))
    est = mean_ci(error_samples(comp, g, s.trials, s.seed))
    return Measurement(
        float(exact / np.square(x).sum()),
        est,
        f"{QSGD_SPEC}; reference: the exact variance sum_i Var[Q_s(v_i)] per l2 bucket (theory.qsgd.total_variance)",
        origin(s, N_QSGD),
        setup={"compressor": QSGD_SPEC, "n": N_QSGD},
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
        "qcs-dither-exact",
        cite(QCS, "eq. (4)-(6) with k = n (QCS-2, Sec. 6): dithered error s^2/12 per element"),
        "equal",
        "E||g_hat - g||^2 / ||g||^2 vs n (s/Q)^2 / 12 / ||g||^2",
        _qcs_dither_exact,
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
    variance_check("half-dither-exact", "dqsg:M=4,half=true", 1024, "equal", DQSG, "Sec. 2.1.1, Lemma 2", 300, 3000),
    variance_check("qsgd-bound", QSGD_SPEC, N_QSGD, "upper", "QSGD", "Lemma 3.1", 300, 3000),
    Check(
        "qsgd-exact",
        cite(DQSG, "Sec. 2.1.1 (the stochastic quantizer's per-element variance), l2 buckets as in QSGD"),
        "equal",
        "E||Q(g) - g||^2 / ||g||^2 vs the exact variance",
        _qsgd_exact,
        {"quick": 300, "full": 3000},
        paper=file_of(DQSG),
    ),
]
