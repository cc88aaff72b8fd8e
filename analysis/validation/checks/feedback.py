"""QCS weighted error feedback (000_4b111efa75352b2d.txt): the residual bounds of Lemma 4 at the optimal weights of
Remark 2, eq. (17) for unbiased QCS and (18) for MMSE-QCS, Karimireddy et al.'s eta_k (Remark 3), and for MMSE-QCS at
a small beta, where (16) as printed gives no bound, the bound derived from Lemma 3 by Minkowski's inequality
(:func:`gradstat.theory.qcs.residual_bound_mmse_minkowski`).

Each trial replays T steps of a gradient sequence (the check's blocks 0..T-1) from r_0 = 0 with its own seed;
the sample of a trial is ``max_t ||r_t||^2 / B`` with ``B = max_t ||g_t||^2``. Its mean bounds
``max_t E||r_t||^2 / B`` from above, so "holds" is conservative (a holds verdict is a real one).
"""

from __future__ import annotations

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.studies.feedback import feedback_theory, residual_samples
from gradstat.analysis.validation.checks.common import block, create
from gradstat.analysis.validation.checks.quantizers import N_QCS, QCS, QCS_MMSE, QCS_UNBIASED
from gradstat.analysis.validation.engine import Check, Measurement, Setting

T = 20


SMALL_BETA = 0.2
"""Feedback weight of the MMSE check where (16) as printed gives no bound (its base is negative for gamma >~ 0.3)."""


def _measure(s: Setting, spec: str, which: str) -> Measurement:
    from gradstat.theory.qcs import karimireddy_residual_bound

    comp = create(spec)
    seq = [[block(s, N_QCS, index=t)] for t in range(T)]
    B = max(float(g[0].double().square().sum()) for g in seq)
    th = feedback_theory(comp, seq[0][0])
    beta, eta_star = th.optimum()
    if which == "minkowski":
        beta = SMALL_BETA
    eta = {
        "karimireddy": lambda: karimireddy_residual_bound(th.gamma),
        "minkowski": lambda: th.eta_minkowski(beta),
    }.get(which, lambda: eta_star)()
    r = residual_samples(comp, beta, seq, [s.seed * 1_000_003 + i for i in range(s.trials)]) / B
    return Measurement(eta, mean_ci(r.max(axis=1)), f"{spec}; gamma={th.gamma:.4g}, beta={beta:.4g}, T={T}")


CHECKS = [
    Check(
        "qcs-feedback-unbiased",
        f"{QCS} Lemma 4 eq. (15) at beta* of (17)",
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_UNBIASED, "star"),
        {"quick": 20, "full": 200},
    ),
    Check(
        "qcs-feedback-mmse",
        f"{QCS} Lemma 4 eq. (16) at beta* = 1 of (18)",
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_MMSE, "star"),
        {"quick": 20, "full": 200},
    ),
    Check(
        "qcs-feedback-mmse-minkowski",
        f"{QCS} (13)-(14) via Minkowski (the reading of (16) that matches (18)), beta = {SMALL_BETA}",
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_MMSE, "minkowski"),
        {"quick": 20, "full": 200},
    ),
    Check(
        "qcs-feedback-karimireddy",
        f"{QCS} Remark 3 (eta_k = 4 gamma (gamma + 1)), beta = 1",
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_MMSE, "karimireddy"),
        {"quick": 20, "full": 200},
    ),
]
