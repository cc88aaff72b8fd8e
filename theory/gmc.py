"""Global momentum compression (GMC): memory bound and communication ratio.

Source: Zhao et al., *Global Momentum Compression* (``GMC (Zhao et al.)``), Lemma 5 eq. (9), Theorem 9 and the
definition of CR in Sec. 5 (with its bound ``(1 + p) s / d``).
"""

from __future__ import annotations

import math

import numpy as np

from gradstat.theory import _checks

__all__ = [
    "memory_bound",
    "lemma5_constant",
    "memory_bound_with_momentum",
    "largest_bounded_momentum",
    "communication_ratio",
    "communication_ratio_bound",
]


def memory_bound(d: int, s: int, grad_bound: float, momentum: float, momentum_constant: float) -> float:
    """Theorem 9: ``E||u_tilde_t||^2 <= 4 (d - s)(2d + s)(G^2 + beta^2 C) / s^2``.

    Source: GMC (Zhao et al.), Theorem 9 (random or top-K masks with ``||m_{t,k}||_0 = s``).

    Parameters
    ----------
    d : model dimension, >= 1. s : coordinates sent per worker and step, in ``[1, d]``.
    grad_bound : G, bound on the stochastic gradient norm (>= 0).
    momentum : beta, the momentum factor in [0, 1).
    momentum_constant : C_{r,q,rho,beta,eta} of the paper's Lemmas (the scalar of its (9) or (10)), >= 0.
    """
    d = _checks.integer("d", d, minimum=1)
    s = _checks.integer("s", s, minimum=1, maximum=d)
    grad_bound = _checks.nonnegative("grad_bound", grad_bound)
    momentum = _checks.real("momentum", momentum, low=0.0, high=1.0, high_open=True)
    momentum_constant = _checks.nonnegative("momentum_constant", momentum_constant)
    return 4.0 * (d - s) * (2 * d + s) * (grad_bound**2 + momentum**2 * momentum_constant) / s**2


def lemma5_constant(grad_bound: float, memory_bound_sq: float, momentum: float) -> float:
    """Lemma 5 eq. (9), constant step: ``C = 2 beta^2 (3 G^2 + 6 U^2) / (1 - beta)^4 + 2 U^2 / (1 - beta)^2``, so
    that ``E||x_t - w_t||^2 <= C eta^2``.

    Source: GMC (Zhao et al.), Lemma 5 eq. (9) and (11) (``C_{0,0,1,beta,eta}``). The lemma assumes
    ``E||u_tilde_t||^2 <= U`` but (9) uses ``U^2``, as Theorems 6-8 assume ``E||u_tilde_t||^2 <= U^2``: here
    ``memory_bound_sq`` is that bound on ``E||u_tilde_t||^2`` (the theorems' U^2).

    Parameters
    ----------
    grad_bound : G >= 0. memory_bound_sq : U^2 >= 0. momentum : beta in [0, 1).
    """
    grad_bound = _checks.nonnegative("grad_bound", grad_bound)
    memory_bound_sq = _checks.nonnegative("memory_bound_sq", memory_bound_sq)
    momentum = _checks.real("momentum", momentum, low=0.0, high=1.0, high_open=True)
    b = momentum
    return 2 * b**2 * (3 * grad_bound**2 + 6 * memory_bound_sq) / (1 - b) ** 4 + 2 * memory_bound_sq / (1 - b) ** 2


def _theorem9_terms(d: int, s: int, momentum: float) -> tuple[float, float, float]:
    """(A, a, c): Theorem 9 with Lemma 5's C reads ``U^2 <= A (G^2 + beta^2 C(U^2))`` with ``C = c G^2 + a' U^2``;
    returns A = 4 (d - s)(2d + s) / s^2, a = A beta^2 (12 beta^2 / (1 - beta)^4 + 2 / (1 - beta)^2) (U^2's
    coefficient on the right) and c = 1 + 6 beta^4 / (1 - beta)^4 (G^2's factor)."""
    b = momentum
    big = 4.0 * (d - s) * (2 * d + s) / s**2
    a = big * b**2 * (12 * b**2 / (1 - b) ** 4 + 2 / (1 - b) ** 2)
    return big, a, 1.0 + 6 * b**4 / (1 - b) ** 4


def memory_bound_with_momentum(d: int, s: int, grad_bound: float, momentum: float) -> float:
    """Theorem 9 at beta > 0 with Lemma 5's C (constant step): the least ``U^2`` consistent with both.

    Theorem 9 bounds ``E||u_tilde_t||^2`` by ``4 (d - s)(2d + s)(G^2 + beta^2 C) / s^2`` while C (Lemma 5 eq. (9))
    grows with the bound U^2 on that same memory, so the pair is a fixed point: ``U^2 = A G^2 c + a U^2`` (see
    :func:`_theorem9_terms`), ``U^2 = A c G^2 / (1 - a)``. Where ``a >= 1`` (beta at or above
    :func:`largest_bounded_momentum`) no finite U^2 satisfies both and the result is ``inf``: the paper's two
    statements then bound nothing. At beta = 0 this is :func:`memory_bound`.

    Source: GMC (Zhao et al.), Theorem 9 with Lemma 5 eq. (9).
    """
    d = _checks.integer("d", d, minimum=1)
    s = _checks.integer("s", s, minimum=1, maximum=d)
    grad_bound = _checks.nonnegative("grad_bound", grad_bound)
    momentum = _checks.real("momentum", momentum, low=0.0, high=1.0, high_open=True)
    big, a, c = _theorem9_terms(d, s, momentum)
    if a >= 1.0:
        return math.inf
    return big * c * grad_bound**2 / (1.0 - a)


def largest_bounded_momentum(d: int, s: int) -> float:
    """The beta below which :func:`memory_bound_with_momentum` is finite (its ``a(beta) = 1``, by bisection; ``a``
    increases with beta): about ``s / (4 d)`` for s << d, so Theorem 9 with Lemma 5's C bounds the memory
    only for a small momentum.

    Source: GMC (Zhao et al.), Theorem 9 with Lemma 5 eq. (9).
    """
    d = _checks.integer("d", d, minimum=1)
    s = _checks.integer("s", s, minimum=1, maximum=d)
    if s == d:
        return 1.0
    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _theorem9_terms(d, s, mid)[1] < 1.0 else (lo, mid)
    return lo


def communication_ratio(mask_nnz: np.ndarray, update_nnz: np.ndarray, d: int) -> float:
    """Measured communication ratio on the server::

        CR = (1/T) sum_t (1 / (p d)) (sum_k ||m_{t,k}||_0 + p ||w_{t+1} - w_t||_0)

    Source: GMC (Zhao et al.), Sec. 5 (definition of CR; all counts in float values).

    Parameters
    ----------
    mask_nnz : ``||m_{t,k}||_0``, shape (T, p): steps by workers.
    update_nnz : ``||w_{t+1} - w_t||_0``, shape (T,).
    d : model dimension.
    """
    d = _checks.integer("d", d, minimum=1)
    m = np.asarray(mask_nnz, dtype=np.float64)
    w = np.asarray(update_nnz, dtype=np.float64).reshape(-1)
    if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
        raise ValueError(f"mask_nnz must have shape (T, p) with T, p >= 1, got {m.shape}")
    if w.shape[0] != m.shape[0]:
        raise ValueError(f"update_nnz must have T={m.shape[0]} entries, got {w.shape[0]}")
    if np.any(m < 0) or np.any(m > d) or np.any(w < 0) or np.any(w > d):
        raise ValueError(f"nonzero counts must lie in [0, d={d}]")
    p = m.shape[1]
    return float(np.mean((m.sum(axis=1) + p * w) / (p * d)))


def communication_ratio_bound(workers: int, s: int, d: int) -> float:
    """Upper bound ``CR <= (1 + p) s / d`` (the update has at most ``p s`` nonzeros).

    Source: GMC (Zhao et al.), Sec. 5 ("the communication compress ratio is smaller than (1 + p) s/d").
    """
    workers = _checks.integer("workers", workers, minimum=1)
    d = _checks.integer("d", d, minimum=1)
    s = _checks.integer("s", s, minimum=0, maximum=d)
    return (1 + workers) * s / d
