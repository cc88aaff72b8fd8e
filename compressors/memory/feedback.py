"""Error feedback with a compensation weight and a residual decay: one mechanism for every paper's variant.

State per worker: the residual h (zero at start). For each step, with compressor C:

    z_t     = g_t + compensation * h_t           (what is compressed)
    zhat_t  = C(z_t)                             (what is sent and applied)
    h_{t+1} = decay * h_t + (z_t - zhat_t)       (memory)

Special cases (each paper's own symbols in brackets):
- none: compensation = 0, decay = 0 (h stays irrelevant).
- plain error feedback (Seide et al. 2014; Karimireddy et al. 2019): compensation = 1, decay = 0, so h = z - C(z).
- QCS weighted feedback, QCS (Abdi & Fekri) eq. (14a-d) with weight beta: compensation = beta,
  decay = 1 - beta (r_{t+1} = (1 - beta) r_t + e_t).
- ECQ-SGD (Wu et al.) (update of h and g~): h_t = beta h_{t-1} + (g_{t-1} - g~_{t-1}),
  g~_t = Q(g_t + alpha h_t). ECQ accumulates the error against the *raw* gradient: g - g~ = (z - zhat) - alpha h,
  so h_{t+1} = (beta - alpha) h_t + (z_t - zhat_t): compensation = alpha, decay = beta - alpha (may be negative).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gradstat.compressors.spec import convert, parse_spec


@dataclass
class FeedbackState:
    """Per-worker residual memory. ``residual`` is None until the first step (then zeros of the gradient's shape)."""

    residual: torch.Tensor | None = None


@dataclass(frozen=True)
class ErrorFeedback:
    """Weighted error feedback ``z = g + compensation*h``, ``h <- decay*h + (z - C(z))``."""

    compensation: float = 1.0
    decay: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.compensation <= 1.0):
            raise ValueError(f"feedback compensation weight must lie in [0, 1], got {self.compensation}")
        if not (-1.0 <= self.decay <= 1.0):
            raise ValueError(f"feedback decay must lie in [-1, 1], got {self.decay}")

    @classmethod
    def none(cls) -> "ErrorFeedback":
        return cls(0.0, 0.0)

    @classmethod
    def plain(cls) -> "ErrorFeedback":
        return cls(1.0, 0.0)

    @classmethod
    def qcs(cls, beta: float) -> "ErrorFeedback":
        """QCS eq. (14): weight beta in (0, 1]."""
        if not (0.0 < beta <= 1.0):
            raise ValueError(f"QCS feedback weight beta must lie in (0, 1], got {beta}")
        return cls(beta, 1.0 - beta)

    @classmethod
    def ecq(cls, alpha: float, beta: float) -> "ErrorFeedback":
        """ECQ-SGD (Wu et al.): compensation coefficient alpha in [0, 1], time decay beta in [0, 1];
        h <- beta h + (g - g~) is h <- (beta - alpha) h + (z - zhat) in this module's terms."""
        if not (0.0 <= beta <= 1.0):
            raise ValueError(f"ECQ time decay beta must lie in [0, 1], got {beta}")
        return cls(alpha, beta - alpha)

    def new_state(self) -> FeedbackState:
        return FeedbackState()

    def residual_growth(self, error_factor: float) -> float:
        """The factor ``decay^2 + error_factor * compensation^2`` by which the residual's second moment is
        multiplied each step, for a compressor whose error ``e = z - C(z)`` has ``E||e||^2 = error_factor ||z||^2``
        and is uncorrelated with the residual (an unbiased compressor's). Below 1 the residual stays bounded;
        at or above 1 it grows geometrically and the run diverges.

        Source: QCS (Abdi & Fekri), Lemma 4 and eq. (15): with compensation beta and decay 1 - beta this is
        ``(1 - beta)^2 + beta^2 gamma``, whose distance to 1 is the denominator of eta; it is below 1 exactly when
        ``beta < 2 / (1 + gamma)``. Plain error feedback (beta = 1) therefore needs ``gamma < 1``."""
        if not error_factor >= 0.0:
            raise ValueError(f"error factor must be >= 0, got {error_factor}")
        return self.decay**2 + error_factor * self.compensation**2

    def compensate(self, g: torch.Tensor, state: FeedbackState) -> torch.Tensor:
        """z_t = g_t + compensation * h_t."""
        if state.residual is None or self.compensation == 0.0:
            return g
        return g + self.compensation * state.residual.to(g.dtype)

    def update(self, z: torch.Tensor, z_hat: torch.Tensor, state: FeedbackState) -> None:
        """h_{t+1} = decay * h_t + (z_t - zhat_t); kept in float32 whatever the gradient dtype."""
        err = z.float() - z_hat.float()
        if state.residual is None or self.decay == 0.0:
            state.residual = err
        else:
            state.residual = self.decay * state.residual + err


def parse_feedback(spec: str) -> ErrorFeedback:
    """``none`` | ``ef`` | ``qcs:beta=0.3`` | ``ecq:alpha=0.2,beta=0.99`` | ``weighted:compensation=..,decay=..``, in
    the one spec grammar (:mod:`gradstat.compressors.spec`). DGC's ``dgc:momentum=..`` is a momentum memory, read
    by :func:`gradstat.compressors.memory.send.parse_memory` where momentum is accepted."""
    name, raw = parse_spec(spec, "feedback")
    builders: dict[str, tuple[Callable[..., ErrorFeedback], tuple[str, ...]]] = {
        "none": (ErrorFeedback.none, ()),
        "ef": (ErrorFeedback.plain, ()),
        "qcs": (ErrorFeedback.qcs, ("beta",)),
        "ecq": (ErrorFeedback.ecq, ("alpha", "beta")),
        "weighted": (ErrorFeedback, ("compensation", "decay")),
    }
    if name == "dgc":
        raise ValueError(
            f"feedback spec {spec!r} is DGC's local momentum correction, which is accepted only where a momentum "
            "memory is (the DDP hook, gradstat train, the layer-wise replay); here use none, ef, qcs, ecq or weighted"
        )
    if name not in builders:
        raise ValueError(
            f"unknown feedback {name!r}; known: {', '.join(builders)} (and dgc where momentum is accepted)"
        )
    fn, keys = builders[name]
    if set(raw) - set(keys):
        raise ValueError(f"feedback {name!r} takes {list(keys) or 'no parameters'}, got {sorted(raw)}")
    return fn(**{k: convert(v, float, f"feedback {name}:{k}") for k, v in raw.items()})
