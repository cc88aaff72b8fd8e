"""Checks of the sparsifiers: Top-k (SIDCo, Abdelmoniem et al., Lemma 3 / App. C), Random-k, and Wangni et al.'s
unbiased sparsification.

Top-k is deterministic given the vector, so its randomness is the vector's: each trial draws a new block (a random
step and window of a dump, or a fresh synthetic draw; :func:`~gradstat.analysis.validation.checks.common.random_block`).
The contraction ``1 - k/d`` holds for every vector and is loose on gradients (they are compressible), so a second
check compares Top-k's error with the exact best-k error ``sum of the d - k smallest g_i^2`` computed here from the
sorted magnitudes, independently of the compressor: that equality sees an off-by-one k, a wrong sign or a scaled
value that the loose bound cannot.
"""

from __future__ import annotations

import math

import numpy as np

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.validation.checks.common import (
    block,
    create,
    exact_agreement,
    origin,
    random_block,
    random_origin,
    variance_check,
)
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.compressors import Context
from gradstat.theory.sources import cite, file_of

SIDCO = "SIDCo"
N = 1000
RATIO = 0.1
TOPK = f"topk:ratio={RATIO}"


def best_k_error(g: np.ndarray, k: int) -> float:
    """``||g - T_k(g)||^2 / ||g||^2`` of the best k-term approximation: the d - k smallest squares over the total
    (SIDCo Def. 1, sigma_k(g)^2), from a sort, float64."""
    sq = np.sort(np.square(g.astype(np.float64)))
    return float(sq[: g.size - k].sum() / sq.sum())


def _topk_samples(s: Setting) -> tuple[np.ndarray, np.ndarray]:
    comp = create(TOPK)
    k = math.ceil(RATIO * N)
    measured, exact = [], []
    for t in range(s.trials):
        g = random_block(s, N, t)
        g64 = g.double()
        measured.append(float((comp(g).double() - g64).square().sum() / g64.square().sum()))
        exact.append(best_k_error(g64.cpu().numpy(), k))
    return np.asarray(measured), np.asarray(exact)


def _contraction(s: Setting) -> Measurement:
    measured, _ = _topk_samples(s)
    k = math.ceil(RATIO * N)
    return Measurement(
        1 - k / N,
        mean_ci(measured),
        f"{TOPK}, d={N}, k={k}; a new block per trial (Top-k's only randomness is the vector's)",
        random_origin(s, N, s.trials),
        setup={"compressor": TOPK, "d": N, "k": k},
    )


def _best_k(s: Setting) -> Measurement:
    measured, exact = _topk_samples(s)
    theory, est = exact_agreement(measured, exact)
    k = math.ceil(RATIO * N)
    return Measurement(
        theory,
        est,
        f"{TOPK}, d={N}, k={k}; reference: the exact best-k error from sorted magnitudes; one measurement (no "
        "randomness given the vectors): the mean reference plus the largest deviation of any trial",
        random_origin(s, N, s.trials),
        deterministic=True,
        setup={"compressor": TOPK, "d": N, "k": k},
    )


RANDK = f"randk:ratio={RATIO}"


def _randk_exact(s: Setting) -> Measurement:
    """Random-k's error given its subset: the energy of ``g`` off the ``k = ceil(delta d)`` coordinates that the
    subset of the call's seed holds (:func:`~gradstat.compressors.schemes.sparsifiers.randk.random_subset`, drawn
    here with the k the paper sets), over ``||g||^2``; equal to the measured error in every trial."""
    from gradstat.compressors.schemes.sparsifiers.randk import random_subset

    comp = create(RANDK)
    g = block(s, N)
    g64 = g.double()
    k = math.ceil(RATIO * N)
    gg = float(g64.square().sum())
    measured, exact = [], []
    for t in range(s.trials):
        ctx = Context(seed=s.seed, step=t)
        measured.append(float((comp.decode(comp.encode(g, ctx), ctx).double() - g64).square().sum()) / gg)
        off = g64.clone()
        off[random_subset(N, k, ctx.call_seed, g.device)] = 0.0
        exact.append(float(off.square().sum()) / gg)
    theory, est = exact_agreement(measured, exact)
    return Measurement(
        theory,
        est,
        f"{RANDK}, d={N}, k={k}; reference: the energy off the call's subset of k coordinates; one measurement "
        "(no randomness given the seeds): the mean reference plus the largest deviation of any trial",
        origin(s, N),
        deterministic=True,
        setup={"compressor": RANDK, "d": N, "k": k},
    )


CHECKS = [
    Check(
        "topk-contraction",
        cite(SIDCO, "Lemma 3 / App. C"),
        "upper",
        "||T_k(g) - g||^2 / ||g||^2",
        _contraction,
        {"quick": 100, "full": 1000},
        paper=file_of(SIDCO),
    ),
    Check(
        "topk-best-k",
        cite(SIDCO, "Def. 1 (best k-term error sigma_k)"),
        "equal",
        "||T_k(g) - g||^2 / ||g||^2 vs exact best-k error",
        _best_k,
        {"quick": 30, "full": 300},
        paper=file_of(SIDCO),
        rel_tolerance=1e-5,
    ),
    variance_check("randk-contraction", RANDK, N, "equal", SIDCO, "Sec. 1 (Random-k); E = 1 - k/d", 300, 3000),
    Check(
        "randk-exact",
        cite(SIDCO, "Sec. 1 (Random-k): error given the subset"),
        "equal",
        "||C(g) - g||^2 / ||g||^2 vs the energy off the subset",
        _randk_exact,
        {"quick": 30, "full": 300},
        paper=file_of(SIDCO),
        rel_tolerance=1e-5,
    ),
    variance_check("wangni-variance", f"wangni:ratio={RATIO}", N, "equal", "wangni", "Sec. 3", 300, 3000),
]
