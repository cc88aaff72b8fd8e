"""GMC's claims (004_8d479783bc85b5d8.txt): the memory bound of Theorem 9 and the communication-ratio bound of Sec. 5.

Both replay :class:`gradstat.compressors.momentum.GlobalMomentumCompression` with top-K masks (``||m_{t,k}||_0 = s``) over
P workers and T steps. Worker k's mini-batch gradient at step t is the check's gradient block number ``t P + k``
(synthetic Laplace by default), and G^2 is the largest squared norm among them, so ``||grad f|| <= G`` holds by
construction. The memory bound is checked with momentum beta = 0, where its constant C drops out
(``4 (d - s)(2d + s) G^2 / s^2``); with beta > 0 it needs C of the paper's Lemma 5, which depends on the whole
trajectory. On a dump the blocks cycle through the dump's few steps, so every trial replays the same gradients
with deterministic top-K masks and the interval has zero width.
"""

from __future__ import annotations

import numpy as np

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.validation.checks.common import block, create
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.compressors import Context

GMC = "004_8d479783bc85b5d8.txt"
D, S, P, T = 1000, 10, 4, 30


def _run(s: Setting, trial: int, momentum: float) -> tuple[float, float, float]:
    """One GMC run: returns (max_t ||u_tilde_t||^2, G^2, CR)."""
    from gradstat.compressors.momentum import GlobalMomentumCompression
    from gradstat.theory.gmc import communication_ratio

    gmc = GlobalMomentumCompression(create(f"topk:ratio={S / D}"), lr=0.1, momentum=momentum)
    states, shared = gmc.new_states(P), gmc.new_shared()
    u_max, g2, masks, updates = 0.0, 0.0, [], []
    for t in range(T):
        grads = [block(s, D, index=(trial * T + t) * P + k) for k in range(P)]
        g2 = max(g2, max(float(g.double().square().sum()) for g in grads))
        res = gmc.round(grads, states, shared, Context(seed=s.seed, step=t))
        u = sum(st.feedback.residual.double() for st in states)
        u_max = max(u_max, float(u.square().sum()))
        masks.append([p.parts["indices"].tensor.numel() for p in res.payloads])
        updates.append(int((res.info["update"] != 0).sum()))
    return u_max, g2, communication_ratio(np.asarray(masks), np.asarray(updates), D)


def _memory(s: Setting) -> Measurement:
    from gradstat.theory.gmc import memory_bound

    runs = [_run(s, t, 0.0) for t in range(s.trials)]
    g2 = max(r[1] for r in runs)
    est = mean_ci([r[0] for r in runs])
    return Measurement(
        memory_bound(D, S, g2**0.5, 0.0, 0.0),
        est,
        f"d={D}, s={S}, p={P}, T={T}, beta=0; sample = max_t ||u_tilde_t||^2 per run",
    )


def _ratio(s: Setting) -> Measurement:
    from gradstat.theory.gmc import communication_ratio_bound

    runs = [_run(s, t, 0.9) for t in range(s.trials)]
    return Measurement(
        communication_ratio_bound(P, S, D), mean_ci([r[2] for r in runs]), f"d={D}, s={S}, p={P}, T={T}, beta=0.9"
    )


CHECKS = [
    Check(
        "gmc-memory", f"{GMC} Thm 9", "upper", "max_t ||sum_k u_t,k||^2 (beta = 0)", _memory, {"quick": 5, "full": 30}
    ),
    Check(
        "gmc-cr",
        f"{GMC} Sec. 5 (CR <= (1 + p) s / d)",
        "upper",
        "communication ratio CR",
        _ratio,
        {"quick": 5, "full": 30},
    ),
]
