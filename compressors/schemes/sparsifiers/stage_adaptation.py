"""SIDCo's per-worker stage adaptation: which number of stages M the next call uses.

SIDCo (Abdelmoniem et al., An Efficient Statistical-based Gradient Compression Technique), Sec. 3 and Algorithm 1
(Adapt_Stages): the worker averages the estimation quality q = k_hat / (delta d) over Q calls; when the average
leaves [1 - eps, 1 + eps] (eq. (12)) the number of stages M changes. Two rules:

- ``"paper"``: Algorithm 1 as printed: M - 1 when q > 1 + eps, M + 1 when q < 1 - eps.
- ``"error"`` (gradstat's): a search for the M in [1, max_stages] whose mean q lies within the tolerance. Every
  period records the mean q of the M it used. While the current M misses the tolerance, the search moves to the
  nearest M it has not measured yet, first in its current direction (starting upwards from M = 1) and only then
  in the other one: it explores before it reverses, so a worse M = 2 between M = 1 and a good M = 3 no longer
  turns it back (the measured case on resnet20, generalized Pareto, delta = 0.001: q = 2.08, 2.26, 1.03 for
  M = 1, 2, 3). When every M has been measured and none meets the tolerance, it settles on the M with the smallest
  measured |q - 1|, says so in :attr:`StageState.verdict`, and only moves again when another M's record beats the
  current one by more than eps (no cycling on noise). When an M that met the tolerance drifts out of it, the older
  records are dropped and the search starts again from there.

A state that has seen fewer than Q calls has never adapted; :attr:`StageState.verdict` says so, so a replay over a
short dump does not present its ``adaptive`` rows as adapted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

HISTORY = 1024
"""How many calls' (M, k_hat/k) a :class:`StageState` remembers (bounded: a state lives for a whole training run)."""

Rule = Literal["error", "paper"]


@dataclass
class StageState:
    """One worker's (and one tensor's) stage state: the current M and what the search has measured.

    stages : M used by the next call.
    calls : calls so far.
    quality_sum : sum of q = k_hat / (delta d) over the current period (reset every Q calls).
    direction : +1 or -1, where the ``error`` search explores next.
    measured : M -> mean q of the latest period run with that M (the ``error`` search's memory).
    settled : ``"searching"``, ``"within"`` (the current M meets the tolerance) or ``"none_within"`` (every M in
        [1, max_stages] was measured and none meets it; the current M is the best measured).
    history : (M, q) of the last ``HISTORY`` calls, for analysis.
    """

    stages: int = 1
    calls: int = 0
    quality_sum: float = 0.0
    direction: int = 1
    measured: dict[int, float] = field(default_factory=dict)
    settled: str = "searching"
    history: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def periods(self, period: int) -> int:
        """How many adaptation periods (of Q calls) have completed."""
        return self.calls // int(period)

    def verdict(self, period: int, eps: float) -> str:
        """One line on where the adaptation stands (never adapted, searching, within tolerance, none within)."""
        if self.periods(period) == 0:
            return f"not adapted: {self.calls} call(s) < Q = {period}, every call used M = {self.stages}"
        if self.settled == "within":
            return f"M = {self.stages} meets |k_hat/k - 1| <= {eps:g} (mean {self.measured[self.stages]:.3g})"
        if self.settled == "none_within":
            tried = ", ".join(f"M={m}: {q:.3g}" for m, q in sorted(self.measured.items()))
            best = min(self.measured, key=lambda m: (abs(self.measured[m] - 1.0), m))
            using = f"using M = {self.stages}" + (
                " (the best measured)"
                if best == self.stages
                else f" (within eps of the best measured, M = {best}; it moves only for a gain larger than eps)"
            )
            return f"no M meets |k_hat/k - 1| <= {eps:g} ({tried}); {using}"
        tried = ", ".join(f"M={m}: {q:.3g}" for m, q in sorted(self.measured.items()))
        return f"searching (measured {tried}), next M = {self.stages}"


def record(state: StageState, quality: float, used: int, period: int, eps: float, max_stages: int, rule: Rule) -> None:
    """Record q = k_hat/(delta d) of one call made with M = ``used`` and, every ``period`` (Q) calls, choose the
    next M within [1, max_stages] by ``rule`` (module docstring)."""
    state.calls += 1
    state.quality_sum += quality
    state.history.append((used, quality))
    if state.calls % int(period):
        return
    mean_q = state.quality_sum / int(period)
    state.quality_sum = 0.0
    if rule == "paper":
        if abs(mean_q - 1.0) > eps:
            step = -1 if mean_q > 1.0 else 1
            state.stages = min(max(state.stages + step, 1), int(max_stages))
        return
    _search(state, used, mean_q, eps, int(max_stages))


def _search(state: StageState, used: int, mean_q: float, eps: float, max_stages: int) -> None:
    """The ``error`` rule after a period run with M = ``used`` whose mean quality was ``mean_q``."""
    was_within = state.settled == "within"
    if was_within and abs(mean_q - 1.0) > eps:  # drifted out: the other records are stale, search again
        state.measured.clear()
    state.measured[used] = mean_q
    if abs(mean_q - 1.0) <= eps:
        state.settled = "within"
        return
    untried = [m for m in range(1, max_stages + 1) if m not in state.measured]
    if untried:
        state.settled = "searching"
        ahead = [m for m in untried if (m - used) * state.direction > 0]
        if not ahead:  # nothing left this way: reverse only now
            state.direction = -state.direction
            ahead = untried
        state.stages = min(ahead, key=lambda m: abs(m - used))
        return
    errors = {m: abs(q - 1.0) for m, q in state.measured.items()}
    best = min(errors, key=lambda m: (errors[m], m))
    if state.settled != "none_within" or errors[used] - errors[best] > eps:
        state.stages = best  # just finished exploring, or another M is clearly better than the current one
    state.settled = "none_within"
