"""What one report run measured: the tables of its studies and the parameters they ran with.

:class:`ReportData` is the whole input of :func:`gradstat.analysis.report.render.render`: every sentence of the
report is computed from it, and a section whose table is None (it did not run) is left out. Each table is the
DataFrame its study returned; ``info`` holds the set-up of each section (steps, block sizes, sources) under the
section's key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

SECTIONS = ("fits", "thresholds", "replays", "variance", "feedback", "feedback_mmse", "variance_gain", "validation")


@dataclass
class ReportData:
    """Measured tables (None: not run) and their set-up.

    Attributes
    ----------
    header : ``generated`` (UTC time), ``machine``, ``device``, ``torch``, ``size`` (quick | full), ``seed``,
        ``command`` (the command line that regenerates the report, optional).
    setup : the dump's description (``workload``, ``numel``, ``tensors``, ``workers``, ``steps``, ``recorded``,
        ``every``, ``optimizer``), None without a dump.
    info : per-section set-up, e.g. ``info["feedback"] = {"n": 4096, ...}``.
    """

    header: dict[str, object]
    setup: dict[str, Any] | None = None
    fits: pd.DataFrame | None = None
    thresholds: pd.DataFrame | None = None
    replays: pd.DataFrame | None = None
    variance: pd.DataFrame | None = None
    feedback: pd.DataFrame | None = None
    feedback_mmse: pd.DataFrame | None = None
    variance_gain: pd.DataFrame | None = None
    validation: pd.DataFrame | None = None
    info: dict[str, dict[str, Any]] = field(default_factory=dict)  # per section: JSON-like notes
    seconds: float | None = None
    related: dict[str, str] = field(default_factory=dict)
    """Other results found beside the report's folder (what they are -> relative link), e.g. the experiments."""

    def ran(self, section: str) -> bool:
        """Whether ``section`` has a non-empty table."""
        if section not in SECTIONS:
            raise ValueError(f"unknown report section {section!r}; known: {', '.join(SECTIONS)}")
        table = getattr(self, section)
        return table is not None and not table.empty

    def table(self, section: str) -> pd.DataFrame:
        """The table of ``section``, which must have run (see :meth:`ran`)."""
        if not self.ran(section):
            raise ValueError(f"report section {section!r} did not run")
        table: pd.DataFrame = getattr(self, section)
        return table

    def check(self, name: str) -> pd.Series | None:
        """The validation row of check ``name`` (None when it did not run)."""
        if not self.ran("validation") or self.validation is None:
            return None
        rows = self.validation[self.validation["check"] == name]
        return None if rows.empty else rows.iloc[0]
