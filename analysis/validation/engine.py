"""The validation engine: a :class:`Check` is a claim of a paper turned into a Monte Carlo experiment.

A check has a name, a readable source (``QCS (Abdi & Fekri) Thm 2 eq. (10)``, from
:func:`gradstat.theory.sources.cite`) with the paper's file kept beside it, a claim direction and a ``measure``
function that returns the theory value, a Monte Carlo :class:`~gradstat.analysis.measure.intervals.Estimate` from
fixed seeds and the provenance of its vectors (a dump's step, worker and block; a synthetic law; or a paper's
constructed example). A measurement whose trials cannot differ (a deterministic computation replayed) is reported
as one measurement: ``deterministic`` is set and the interval is the value itself. The verdict
compares the interval with the theory value by the rule of :mod:`gradstat.analysis.measure.verdicts`. A 99 %
interval misses a true value once in 100 seeds, so with some thirty checks a run would report a false violation
about one time in four: a statistical violation is therefore replicated once with independent seeds (the same
vectors) and stands only when the replication is violated too (a false alarm then has probability about 1e-4 per
check; a real bug is violated in both). The note keeps both measurements. A check is also
**not applicable** when a piece it needs is not available (its ``measure`` raises :class:`NotApplicable`).

The same engine backs the pytest regression suite, ``gradstat validate`` and the report.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

import torch

from gradstat.analysis.measure.intervals import Estimate
from gradstat.analysis.measure.verdicts import VERDICTS, Claim, Size, Verdict, verdict

if TYPE_CHECKING:
    from gradstat.analysis.measure.sources import GradientSource

__all__ = [
    "Check",
    "Claim",
    "Measurement",
    "NotApplicable",
    "Result",
    "Setting",
    "Size",
    "Verdict",
    "VERDICTS",
    "run_checks",
    "verdict",
]


REPLICATION_SEED = 7_919
"""Offset of the seed of the replication that confirms a statistical violation (see :meth:`Check.run`)."""


class NotApplicable(Exception):
    """Raised by a ``measure`` function when the check cannot run here (say why in the message)."""


@dataclass(frozen=True)
class Measurement:
    """What a check's ``measure`` returns: the theory value (None: no bound), the Monte Carlo estimate, the
    provenance of the vectors (``vectors``: ``dump D step s worker w (block a:b)``, ``synthetic: Laplace(1), d =
    1000``, ``constructed (paper's counter-example)``), whether the trials are all the same computation
    (``deterministic``) and the set-up parameters (``setup``: name -> value, rendered by the report)."""

    theory: float | None
    estimate: Estimate
    note: str = ""
    vectors: str = ""
    deterministic: bool = False
    setup: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """Where a check runs: Monte Carlo size, base seed, device and the gradient source (see ``vectors.py``)."""

    trials: int
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    source: GradientSource | None = None


@dataclass(frozen=True)
class Check:
    """One claim of a paper as an experiment.

    Attributes
    ----------
    name : short identifier (``qcs-gamma``), unique in the registry.
    source : readable citation, e.g. ``QCS (Abdi & Fekri) Thm 2 eq. (10)`` (:func:`gradstat.theory.sources.cite`).
    claim : ``upper`` (empirical <= theory), ``lower`` or ``equal``.
    quantity : what is estimated, in words (e.g. ``E||g - g_hat||^2 / ||g||^2``).
    measure : ``measure(setting) -> Measurement``; draws only from generators seeded by ``setting.seed``.
    trials : Monte Carlo trials for the ``quick`` and ``full`` sizes.
    tolerance : absolute slack of an equality claim (0 for a purely statistical comparison).
    must_hold : a violation of this check is a failure (exit status 1); False for claims the project reports
        without endorsing (e.g. an equation that is wrong as printed, or a bound too loose to be a test).
    paper : the paper's file for traceability (:func:`gradstat.theory.sources.file_of`); "" for outside sources.
    rel_tolerance : slack of an equality claim relative to ``|theory|`` (float32 round-off of exact identities).
    """

    name: str
    source: str
    claim: Claim
    quantity: str
    measure: Callable[[Setting], Measurement]
    trials: dict[Size, int]
    tolerance: float = 0.0
    must_hold: bool = True
    paper: str = ""
    rel_tolerance: float = 0.0

    def run(
        self,
        size: Size = "quick",
        seed: int = 0,
        device: torch.device | str = "cpu",
        source: GradientSource | None = None,
    ) -> "Result":
        """Run the experiment and return its verdict (exceptions other than :class:`NotApplicable` propagate)."""
        if size not in self.trials:
            raise ValueError(f"size must be one of {', '.join(self.trials)}, got {size!r}")
        setting = Setting(self.trials[size], seed, torch.device(device), source)
        t0 = time.perf_counter()
        try:
            m = self.measure(setting)
        except NotApplicable as exc:
            return Result(self, None, None, "not applicable", str(exc), time.perf_counter() - t0)
        tol = self.tolerance + (self.rel_tolerance * abs(m.theory) if m.theory is not None else 0.0)
        v = verdict(self.claim, m.theory, m.estimate, tol)
        estimate, note = m.estimate, m.note
        if v == "violated" and not m.deterministic:
            # a 99 % interval misses a true value once in 100 seeds: a violation stands only when an independent
            # replication (fresh seeds, the same vectors) is violated too
            again = self.measure(Setting(self.trials[size], seed + REPLICATION_SEED, torch.device(device), source))
            v = verdict(self.claim, again.theory, again.estimate, tol)
            first = f"seed {seed}: {m.estimate} against {m.theory:.4g} (violated)"
            note = f"{note}; {first}, replicated at seed {seed + REPLICATION_SEED}: {again.estimate} ({v})"
            if v != "violated":
                estimate = again.estimate
        return Result(
            self,
            m.theory,
            estimate,
            v,
            note,
            time.perf_counter() - t0,
            m.vectors,
            m.deterministic,
            dict(m.setup),
        )


@dataclass(frozen=True)
class Result:
    """A check's outcome; :meth:`row` is its line in the validation table."""

    check: Check
    theory: float | None
    estimate: Estimate | None
    verdict: Verdict
    note: str = ""
    seconds: float = 0.0
    vectors: str = ""
    deterministic: bool = False
    setup: dict[str, object] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """A check that must hold was violated."""
        return self.verdict == "violated" and self.check.must_hold

    @property
    def ratio(self) -> float:
        """theory / empirical mean (how loose an upper bound is); NaN where undefined (no value, or a zero)."""
        if self.theory is None or self.estimate is None or self.estimate.mean == 0 or self.theory == 0:
            return math.nan
        return self.theory / self.estimate.mean

    def row(self) -> dict[str, object]:
        e = self.estimate
        nan = math.nan
        det = self.deterministic
        return {
            "check": self.check.name,
            "source": self.check.source,
            "paper_file": self.check.paper,
            "claim": self.check.claim,
            "quantity": self.check.quantity,
            "vectors": self.vectors,
            "theory": nan if self.theory is None else self.theory,
            "empirical": nan if e is None else e.mean,
            "ci_low": nan if e is None or det else e.low,
            "ci_high": nan if e is None or det else e.high,
            "level": nan if e is None or det else e.level,
            "trials": 0 if e is None else 1 if det else e.trials,
            "deterministic": det,
            "theory_over_empirical": self.ratio,
            "verdict": self.verdict,
            "must_hold": self.check.must_hold,
            "tolerance": self.check.tolerance + (self.check.rel_tolerance * abs(self.theory) if self.theory else 0.0),
            "note": self.note,
            "setup": "; ".join(f"{k}={v}" for k, v in self.setup.items()),
            "seconds": round(self.seconds, 3),
        }


def run_checks(
    checks: Iterable[Check],
    size: Size = "quick",
    seed: int = 0,
    device: torch.device | str = "cpu",
    source: GradientSource | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run ``checks`` in order; ``on_result`` is called after each (progress, writing the table as we go)."""
    results = []
    for c in checks:
        r = c.run(size, seed, device, source)
        results.append(r)
        if on_result is not None:
            on_result(r)
    return results
