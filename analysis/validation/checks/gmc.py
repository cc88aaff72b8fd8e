"""GMC's claims (Zhao et al., Global Momentum Compression): the memory of Theorem 9 and the communication ratio CR
of Sec. 5, each with a companion that can fail.

Every run replays :class:`gradstat.compressors.memory.momentum.GlobalMomentumCompression` over P workers and T steps.
Worker k's mini-batch gradient at step t is a block drawn at random for that (run, step, worker)
(:func:`~gradstat.analysis.validation.checks.common.random_block`: a random step and window of a dump, or a fresh
synthetic draw), so runs are independent Monte Carlo trials.

- ``gmc-memory`` (Theorem 9, upper): random-K masks (``randk``, ``||m_{t,k}||_0 = s``, what the theorem allows
  besides top-K) and momentum beta = 0, where the constant C drops out: ``4 (d - s)(2d + s) G^2 / s^2`` with G^2
  the largest squared gradient norm of the run. The bound is thousands of times the memory, so it cannot see a
  realistic bug: a reported row (``must_hold`` False), the paper's claim shown beside the must-hold recursion.
- ``gmc-memory-momentum`` (Theorem 9 at beta > 0, upper, reported): C of Lemma 5 eq. (9) grows with the memory
  bound it serves, so the two are solved as a fixed point (:func:`gradstat.theory.gmc.memory_bound_with_momentum`),
  finite only below a momentum of about s / (4 d); run at half that momentum.
- ``gmc-memory-recursion`` (equality): top-K masks and beta = 0.9; ``max_t ||sum_k u_{t,k}||^2`` of the compressor
  against the same quantity from the exact recursion of Algorithm 1 (``g = grad/p - beta/(p eta)(w_t - w_{t-1})``,
  ``u <- (1 - m) (g + u)``, m the top-s of |g + u|, ``w_{t+1} = w_t - eta sum_k m (g + u)``) computed here in
  float64 NumPy, independently of the code under test; one measurement (the runs replay fixed draws), the must-hold
  check of GMC's memory.
- ``gmc-cr`` (Sec. 5, upper): CR with random-K masks and beta = 0.9 against ``(1 + p) s / d``.
- ``gmc-cr-exact`` (equality): with independent uniformly random s-subsets the masks cover, on average,
  ``d (1 - (1 - s/d)^p)`` coordinates, so ``E[CR] = s/d + 1 - (1 - s/d)^p`` exactly when the update's support is
  counted as the union of the masks (the positions the server must send; counting the update's nonzeros instead,
  as ``gmc-cr`` does, a gradient's exact zeros -- dead units of a real network -- lower it).
"""

from __future__ import annotations

import functools
import operator

import numpy as np
import torch

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.studies.feedback import residual_of
from gradstat.analysis.validation.checks.common import create, exact_agreement, random_block, random_origin
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.compressors import Context, Payload
from gradstat.theory.sources import cite, file_of

GMC = "GMC"
D, S, P, T = 1000, 10, 4, 30
LR = 0.1


def _grads(s: Setting, run: int, t: int) -> list[torch.Tensor]:
    return [random_block(s, D, (run * T + t) * P + k) for k in range(P)]


def _run(s: Setting, run: int, masks: str, momentum: float) -> dict[str, float]:
    """One GMC run with ``masks`` ``randk`` or ``topk``: max_t ||u_tilde_t||^2, G^2, CR and the exact-recursion
    reference of max_t ||u_tilde_t||^2 (top-K only)."""
    from gradstat.compressors.memory.momentum import GlobalMomentumCompression
    from gradstat.theory.gmc import communication_ratio

    gmc = GlobalMomentumCompression(create(f"{masks}:ratio={S / D}"), lr=LR, momentum=momentum)
    states, shared = gmc.new_states(P), gmc.new_shared()
    ref_u = np.zeros((P, D))
    ref_last: np.ndarray | None = None
    u_max = ref_max = g2 = 0.0
    mask_nnz, update_nnz, union = [], [], []
    for t in range(T):
        grads = _grads(s, run, t)
        g2 = max(g2, max(float(g.double().square().sum()) for g in grads))
        res = gmc.round(grads, states, shared, Context(seed=s.seed * 1_000_003 + run, step=t))
        u = functools.reduce(operator.add, (residual_of(st.feedback).double() for st in states))
        u_max = max(u_max, float(u.square().sum()))
        if res.info is None:
            raise ValueError("GMC's round reports its update in info; got none")
        update_nnz.append(int((res.info["update"] != 0).sum()))
        if masks == "randk":  # ||m_{t,k}||_0: the values sent; the positions as the receiver regenerates them
            sent = [_positions(p) for p in res.payloads]
            mask_nnz.append([len(x) for x in sent])
            union.append(len(set().union(*sent)))
        else:
            mask_nnz.append([int(p.parts["indices"].tensor.numel()) for p in res.payloads])
        if masks == "topk":
            ref_last = _reference_step(np.stack([g.double().cpu().numpy() for g in grads]), ref_u, ref_last, momentum)
            ref_max = max(ref_max, float(np.square(ref_u.sum(0)).sum()))
    cr = communication_ratio(np.asarray(mask_nnz), np.asarray(update_nnz), D)
    cr_masks = communication_ratio(np.asarray(mask_nnz), np.asarray(union), D) if union else float("nan")
    return {"u_max": u_max, "g2": g2, "cr": cr, "cr_masks": cr_masks, "ref_max": ref_max}


def _positions(payload: Payload) -> set[int]:
    """The coordinates a random-K payload covers (``randk`` sends values and the seed of its subset)."""
    from gradstat.compressors.schemes.sparsifiers.randk import random_subset

    k = payload["values"].numel()
    return set(random_subset(payload.numel, k, payload.seed, payload["values"].device).tolist())


def _reference_step(grads: np.ndarray, u: np.ndarray, last: np.ndarray | None, momentum: float) -> np.ndarray:
    """One step of GMC's Algorithm 1 with top-s masks, in place on the memories ``u`` (p, d); returns
    ``w_{t+1} - w_t``."""
    p = grads.shape[0]
    g = grads / p if last is None else grads / p - momentum / (p * LR) * last
    z = g + u
    sent = np.zeros_like(z)
    for k in range(p):
        idx = np.argpartition(-np.abs(z[k]), S - 1)[:S]
        sent[k, idx] = z[k, idx]
    u[:] = z - sent
    return -LR * sent.sum(0)


def _setup(masks: str, momentum: float) -> dict[str, object]:
    return {"d": D, "s": S, "p": P, "T": T, "masks": masks, "beta": momentum, "eta": LR}


def _memory(s: Setting) -> Measurement:
    from gradstat.theory.gmc import memory_bound

    runs = [_run(s, r, "randk", 0.0) for r in range(s.trials)]
    g2 = max(r["g2"] for r in runs)
    return Measurement(
        memory_bound(D, S, g2**0.5, 0.0, 0.0),
        mean_ci([r["u_max"] for r in runs]),
        f"d={D}, s={S}, p={P}, T={T}, random-K masks, beta=0; sample = max_t ||u_tilde_t||^2 per run; "
        "G^2 = largest squared gradient norm",
        random_origin(s, D, s.trials, "worker and step of a run"),
        setup=_setup("random-K", 0.0),
    )


def _memory_momentum(s: Setting) -> Measurement:
    """Theorem 9 at beta > 0 with Lemma 5's C (:func:`gradstat.theory.gmc.memory_bound_with_momentum`): at half the
    largest momentum for which the pair has a finite fixed point (above it the paper's statements bound nothing)."""
    from gradstat.theory.gmc import largest_bounded_momentum, memory_bound_with_momentum

    top = largest_bounded_momentum(D, S)
    beta = round(top / 2, 6)
    runs = [_run(s, r, "randk", beta) for r in range(s.trials)]
    g2 = max(r["g2"] for r in runs)
    return Measurement(
        memory_bound_with_momentum(D, S, g2**0.5, beta),
        mean_ci([r["u_max"] for r in runs]),
        f"d={D}, s={S}, p={P}, T={T}, random-K masks, beta={beta:g} (finite only for beta < {top:.4g}: at the "
        f"recursion's beta = 0.9 the bound is {memory_bound_with_momentum(D, S, g2**0.5, 0.9):g}); C from Lemma 5 "
        "eq. (9) solved with the bound as a fixed point",
        random_origin(s, D, s.trials, "worker and step of a run"),
        setup=_setup("random-K", beta),
    )


def _recursion(s: Setting) -> Measurement:
    runs = [_run(s, r, "topk", 0.9) for r in range(s.trials)]
    theory, est = exact_agreement([r["u_max"] for r in runs], [r["ref_max"] for r in runs])
    return Measurement(
        theory,
        est,
        f"d={D}, s={S}, p={P}, T={T}, top-K masks, beta=0.9, eta={LR}; reference: Algorithm 1's recursion in "
        "float64 NumPy; one measurement (the same draws replayed): the mean reference plus the largest deviation "
        "of any run",
        random_origin(s, D, s.trials, "worker and step of a run"),
        deterministic=True,
        setup=_setup("top-K", 0.9),
    )


def _ratio(s: Setting) -> Measurement:
    from gradstat.theory.gmc import communication_ratio_bound

    runs = [_run(s, r, "randk", 0.9) for r in range(s.trials)]
    return Measurement(
        communication_ratio_bound(P, S, D),
        mean_ci([r["cr"] for r in runs]),
        f"d={D}, s={S}, p={P}, T={T}, random-K masks, beta=0.9",
        random_origin(s, D, s.trials, "worker and step of a run"),
        setup=_setup("random-K", 0.9),
    )


def _ratio_exact(s: Setting) -> Measurement:
    runs = [_run(s, r, "randk", 0.9) for r in range(s.trials)]
    return Measurement(
        S / D + 1 - (1 - S / D) ** P,
        mean_ci([r["cr_masks"] for r in runs]),
        f"d={D}, s={S}, p={P}, T={T}, random-K masks, beta=0.9; E[CR] = s/d + 1 - (1 - s/d)^p (union of p "
        "independent random s-subsets); the update's support counted as the union of the masks (a gradient's "
        "exact zeros would otherwise lower it)",
        random_origin(s, D, s.trials, "worker and step of a run"),
        setup=_setup("random-K", 0.9),
    )


CHECKS = [
    Check(
        "gmc-memory",
        cite(GMC, "Thm 9"),
        "upper",
        "max_t ||sum_k u_t,k||^2 (beta = 0)",
        _memory,
        {"quick": 10, "full": 100},
        must_hold=False,
        paper=file_of(GMC),
    ),
    Check(
        "gmc-memory-momentum",
        cite(GMC, "Thm 9 with Lemma 5 eq. (9), beta > 0"),
        "upper",
        "max_t ||sum_k u_t,k||^2 (beta > 0)",
        _memory_momentum,
        {"quick": 10, "full": 100},
        must_hold=False,
        paper=file_of(GMC),
    ),
    Check(
        "gmc-memory-recursion",
        cite(GMC, "Algorithm 1 / eq. (4) (memory recursion)"),
        "equal",
        "max_t ||sum_k u_t,k||^2 (beta = 0.9) vs exact recursion",
        _recursion,
        {"quick": 5, "full": 50},
        paper=file_of(GMC),
        rel_tolerance=1e-4,
    ),
    Check(
        "gmc-cr",
        cite(GMC, "Sec. 5 (CR <= (1 + p) s / d)"),
        "upper",
        "communication ratio CR",
        _ratio,
        {"quick": 10, "full": 100},
        paper=file_of(GMC),
    ),
    Check(
        "gmc-cr-exact",
        cite(GMC, "Sec. 5 (CR), random-K masks"),
        "equal",
        "communication ratio CR",
        _ratio_exact,
        {"quick": 10, "full": 100},
        paper=file_of(GMC),
    ),
]
