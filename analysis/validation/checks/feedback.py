"""QCS weighted error feedback (Abdi & Fekri, Quantized Compressive Sampling): the residual bounds of Lemma 4 at
the optimal weights of Remark 2, eq. (17) for unbiased QCS and (18) for MMSE-QCS, Karimireddy et al.'s eta_k
(Remark 3), and for MMSE-QCS at a small beta, where (16) as printed gives no bound, the bound derived from Lemma 3
by Minkowski's inequality (:func:`gradstat.theory.qcs.residual_bound_mmse_minkowski`).

Each trial replays T steps of a gradient sequence (the check's blocks 0..T-1; a dump's few steps are cycled) from
r_0 = 0 with its own seed; the sample of a trial is ``max_t ||r_t||^2 / B`` with ``B = max_t ||g_t||^2``. Its mean
bounds ``max_t E||r_t||^2 / B`` from above, so "holds" is conservative (a holds verdict is a real one).

T: the residual settles like ``1 - (1 - beta)^t`` (``r_{t+1} = (1 - beta) r_t + e_t``), so each check replays
``T = settle_steps(beta)`` steps, the first T with ``(1 - beta)^T <= 1e-4`` and at least 20
(:func:`gradstat.analysis.studies.feedback.settle_steps`): 42 steps at beta = 0.2, 20 at beta = 1.
"""

from __future__ import annotations

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.studies.feedback import feedback_theory, residual_of, residual_samples, settle_steps
from gradstat.analysis.validation.checks.common import block, create, exact_agreement, origin
from gradstat.analysis.validation.checks.quantizers import N_QCS, QCS, QCS_MMSE, QCS_UNBIASED
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.compressors import Context
from gradstat.theory.sources import cite, file_of

SMALL_BETA = 0.2
"""Feedback weight of the MMSE check where (16) as printed gives no bound (its base is negative for gamma >~ 0.3)."""


def _measure(s: Setting, spec: str, which: str) -> Measurement:
    from gradstat.theory.qcs import karimireddy_residual_bound

    comp = create(spec)
    th = feedback_theory(comp, block(s, N_QCS))
    if th.gamma is None:
        raise ValueError(f"{spec}: QCS has a closed-form gamma; got none")
    gamma = th.gamma
    beta, eta_star = th.optimum()
    if which == "minkowski":
        beta = SMALL_BETA
    T = settle_steps(beta)
    seq = [[block(s, N_QCS, index=t)] for t in range(T)]
    B = max(float(g[0].double().square().sum()) for g in seq)
    eta = {
        "karimireddy": lambda: karimireddy_residual_bound(gamma),
        "minkowski": lambda: th.eta_minkowski(beta),
    }.get(which, lambda: eta_star)()
    r = residual_samples(comp, beta, seq, [s.seed * 1_000_003 + i for i in range(s.trials)]) / B
    return Measurement(
        eta,
        mean_ci(r.max(axis=1)),
        f"{spec}; gamma={th.gamma:.4g}, beta={beta:.4g}, T={T} steps ((1 - beta)^T <= 1e-4: the residual has "
        "settled), one worker; sample = max_t ||r_t||^2 / B per seed",
        origin(s, N_QCS, range(T)),
        setup={"compressor": spec, "n": N_QCS, "beta": round(beta, 4), "T": T, "workers": 1},
    )


RECURSION_BETA = 0.2


def _recursion(s: Setting) -> Measurement:
    """The feedback pipeline's residual against eq. (14a-d) written out here: ``z_t = g_t + beta r_t``,
    ``z_hat_t = C(z_t)`` (the same compressor call, same seeds), ``r_{t+1} = (1 - beta) r_t + (z_t - z_hat_t)``,
    in the same float32 arithmetic. Sample per seed: ``max_t ||r_t - r_t^ref|| / ||r_t^ref||`` (0 when the
    pipeline is the recursion)."""
    from gradstat.compressors import ErrorFeedback
    from gradstat.compressors.memory.send import feedback_round, new_worker_states

    comp = create(QCS_UNBIASED)
    beta = RECURSION_BETA
    T = settle_steps(beta)
    seq = [block(s, N_QCS, index=t) for t in range(T)]
    samples = []
    for i in range(s.trials):
        seed = s.seed * 1_000_003 + i
        states = new_worker_states(comp, 1)
        fb = ErrorFeedback.qcs(beta)
        ref, worst = None, 0.0
        for t, g in enumerate(seq):
            ctx = Context(seed=seed, step=t)
            z = g if ref is None else g + beta * ref
            wctx = ctx.but(worker=0, state=comp.new_state())
            err = z.float() - comp.decode(comp.encode(z, wctx), wctx).float()
            ref = err if ref is None else (1.0 - beta) * ref + err
            feedback_round(comp, fb, [g], states, ctx)
            r = residual_of(states[0].feedback)
            worst = max(worst, float((r.double() - ref.double()).norm() / ref.double().norm()))
        samples.append(worst)
    theory, est = exact_agreement(samples, [0.0] * len(samples))
    return Measurement(
        theory,
        est,
        f"{QCS_UNBIASED}; beta={beta}, T={T}; reference: (14a-d) written out with the same compressor calls; one "
        "measurement (the same draws replayed): the largest deviation over the seeds",
        origin(s, N_QCS, range(T)),
        deterministic=True,
        setup={"compressor": QCS_UNBIASED, "n": N_QCS, "beta": beta, "T": T, "workers": 1},
    )


CHECKS = [
    Check(
        "qcs-feedback-recursion",
        cite(QCS, "eq. (14a-d) (weighted error feedback)"),
        "equal",
        "max_t ||r_t - r_t(14)|| / ||r_t(14)||",
        _recursion,
        {"quick": 5, "full": 50},
        tolerance=1e-5,
        paper=file_of(QCS),
    ),
    Check(
        "qcs-feedback-unbiased",
        cite(QCS, "Lemma 4 eq. (15) at beta* of (17)"),
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_UNBIASED, "star"),
        {"quick": 20, "full": 200},
        paper=file_of(QCS),
    ),
    Check(
        "qcs-feedback-mmse",
        cite(QCS, "Lemma 4 eq. (16) at beta* = 1 of (18)"),
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_MMSE, "star"),
        {"quick": 20, "full": 200},
        paper=file_of(QCS),
    ),
    Check(
        "qcs-feedback-mmse-minkowski",
        cite(QCS, f"(13)-(14) via Minkowski (the reading of (16) that matches (18)), beta = {SMALL_BETA}"),
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_MMSE, "minkowski"),
        {"quick": 20, "full": 200},
        must_hold=False,  # 100-200x the residual: no realistic bug reaches it (the recursion is the must-hold check)
        paper=file_of(QCS),
    ),
    Check(
        "qcs-feedback-karimireddy",
        cite(QCS, "Remark 3 (Karimireddy et al.'s eta_k = 4 gamma (gamma + 1)), beta = 1"),
        "upper",
        "max_t E||r_t||^2 / B",
        lambda s: _measure(s, QCS_MMSE, "karimireddy"),
        {"quick": 20, "full": 200},
        paper=file_of(QCS),
    ),
]
