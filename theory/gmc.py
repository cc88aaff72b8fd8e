"""Global momentum compression (GMC): memory bound and communication ratio.

Source: Zhao et al., *Global Momentum Compression* (``GMC (Zhao et al.)``), Theorem 9 and the
definition of CR in Sec. 5 (with its bound ``(1 + p) s / d``).
"""

from __future__ import annotations

import numpy as np

from gradstat.theory import _checks

__all__ = ["memory_bound", "communication_ratio", "communication_ratio_bound"]


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
