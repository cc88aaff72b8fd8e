"""Checks of the sparsifiers: Top-k contraction (SIDCo App. C), Random-k, Wangni's unbiased sparsification."""

from __future__ import annotations

import math

import numpy as np

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.validation.checks.common import block, create, variance_check
from gradstat.analysis.validation.engine import Check, Measurement, Setting

SIDCO = "001_ac87256369ec7547.txt"
N = 1000
RATIO = 0.1


def _topk(s: Setting) -> Measurement:
    """||T_k(g) - g||^2 / ||g||^2 over different gradient blocks (Top-k is deterministic, so the randomness is the
    vector's); the contraction 1 - k/d holds for every g."""
    comp = create(f"topk:ratio={RATIO}")
    samples = []
    for t in range(s.trials):
        g = block(s, N, index=t).double()
        samples.append(float((comp(g.float()).double() - g).square().sum() / g.square().sum()))
    k = math.ceil(RATIO * N)
    return Measurement(1 - k / N, mean_ci(np.asarray(samples)), f"topk ratio={RATIO}, d={N}, vectors vary")


CHECKS = [
    Check(
        "topk-contraction",
        f"{SIDCO} Lemma 3 / App. C",
        "upper",
        "||T_k(g) - g||^2 / ||g||^2",
        _topk,
        {"quick": 100, "full": 1000},
    ),
    variance_check(
        "randk-contraction", f"randk:ratio={RATIO}", N, "equal", f"{SIDCO} Sec. 1 (Random-k); E = 1 - k/d", 300, 3000
    ),
    variance_check(
        "wangni-variance", f"wangni:ratio={RATIO}", N, "equal", "Wangni et al. 2018 Sec. 3 (000 Fig. 3)", 300, 3000
    ),
]
