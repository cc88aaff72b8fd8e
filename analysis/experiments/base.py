"""What an experiment is and what it leaves behind: tables, figures, and the paper's numbers beside ours.

An experiment reproduces one figure or table of a paper. It runs for real (trains or replays), returns an
:class:`ExperimentResult` holding its measured tables, the figures it drew and a list of :class:`Comparison` rows
(a quantity the paper publishes, where it is published, and our measurement of it), and :func:`write_result` writes
everything under one folder:

- ``<table>.csv`` / ``<table>.md`` for every measured table (per-step tables, ``*_steps``, as CSV only),
  ``<figure>.png`` (+ the CSV of what it drew);
- ``comparison.csv`` and ``README.md``: the paper-vs-ours table with one verdict per row and a one-line verdict
  for the experiment, all generated from the numbers.

A comparison row is one of:

- ``value``: the paper prints a number; ours reproduces it when within ``tolerance`` (relative);
- ``at_most`` / ``at_least``: the paper states a bound or direction (e.g. "ECQ's gap is smaller than QSGD's"), read
  as ``ours <= paper`` / ``ours >= paper``;
- ``claim``: the paper's figure shows a trend but prints no number; ``paper`` then holds the value the claim implies
  (1 for "holds"), ours the measured truth value, and ``paper_text`` quotes the claim;
- ``share``: a claim about every step, judged per step (:mod:`gradstat.analysis.experiments.rules`): ``ours`` is
  the share of steps meeting it with its interval ``[low, high]``, ``paper`` the share the claim needs; it holds
  when the interval lies at or above that share, fails when it lies below, and is undecided when it straddles it.

The rules of :mod:`gradstat.analysis.experiments.rules` decide which rows exist (a paper value only where the paper
states it), how non-convergence counts, and how a sufficient condition is shown.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

import pandas as pd
import torch

from gradstat.analysis.measure.tables import atomic_write_text, to_markdown, write_table

VERDICT = "**Verdict:** "
"""How an experiment's README opens its overall verdict line (the experiments index reads it back)."""

Kind = Literal["value", "at_most", "at_least", "claim", "share"]


@dataclass(frozen=True)
class Comparison:
    """One published quantity beside ours.

    quantity : what is compared, in words (with its unit).
    paper : the published number (or the bound, or 1.0 for a claim that holds); NaN when the paper gives none.
    reference : where it is published (paper short name, section, figure or table, page where known).
    ours : our measurement.
    kind : how the two are compared (module docstring).
    tolerance : relative tolerance of ``value`` rows (0.1 = 10 %).
    paper_text : the paper's words when it prints no number.
    """

    quantity: str
    paper: float
    reference: str
    ours: float
    kind: Kind = "value"
    tolerance: float = 0.1
    paper_text: str = ""
    low: float = math.nan
    high: float = math.nan

    def holds(self) -> bool | None:
        """True when ours agrees with the paper (by ``kind``), False when not, None when nothing can be compared
        (or, for a ``share``, when its interval straddles the share needed)."""
        if math.isnan(self.paper) or math.isnan(self.ours):
            return None
        if self.kind == "share":
            return True if self.low >= self.paper else False if self.high < self.paper else None
        if self.kind == "at_most":
            return self.ours <= self.paper
        if self.kind == "at_least":
            return self.ours >= self.paper
        if self.kind == "claim":
            return (self.ours >= 0.5) == (self.paper >= 0.5)
        scale = max(abs(self.paper), 1e-300)
        return abs(self.ours - self.paper) <= self.tolerance * scale

    def verdict(self) -> str:
        """``reproduces`` / ``differs (+x %)`` / ``claim holds`` / ``claim fails`` / ``not comparable``."""
        ok = self.holds()
        if self.kind == "share" and not math.isnan(self.ours):
            measured = f"{self.ours:.0%} of steps [{self.low:.0%}, {self.high:.0%}]"
            state = "holds" if ok else "undecided" if ok is None else "fails"
            return f"{state} ({measured}, needs {self.paper:.0%})"
        if ok is None:
            return "not comparable"
        if self.kind == "claim":
            return "claim holds" if ok else "claim fails"
        if self.kind in ("at_most", "at_least"):
            return "holds" if ok else f"fails ({self.ours:.4g} vs {self.paper:.4g})"
        if ok:
            return "reproduces"
        rel = (self.ours - self.paper) / max(abs(self.paper), 1e-300)
        return f"differs ({rel:+.0%})"


def comparison_table(rows: Sequence[Comparison]) -> pd.DataFrame:
    """The paper-vs-ours table (one row per comparison, with its verdict)."""
    return pd.DataFrame(
        [
            {
                "quantity": c.quantity,
                "paper": c.paper_text or c.paper,
                "ours": c.ours,
                "reference": c.reference,
                "verdict": c.verdict(),
            }
            for c in rows
        ],
        columns=["quantity", "paper", "ours", "reference", "verdict"],
    )


def overall_verdict(rows: Sequence[Comparison]) -> str:
    """One line from the rows: how many of the comparable ones agree, how many per-step claims are undecided, and
    the largest disagreement named."""
    judged = [c for c in rows if c.holds() is not None]
    open_ = [c for c in rows if c.kind == "share" and c.holds() is None and not math.isnan(c.ours)]
    undecided = f"; {len(open_)} per-step claims undecided (their interval straddles the share needed)" if open_ else ""
    if not judged:
        return "nothing comparable: the paper publishes no number this run measures" + undecided
    bad = [c for c in judged if not c.holds()]
    if not bad:
        return f"reproduces: all {len(judged)} comparable published results agree" + undecided
    names = "; ".join(f"{c.quantity}: paper {c.paper_text or f'{c.paper:.4g}'}, ours {c.ours:.4g}" for c in bad[:3])
    return f"differs: {len(judged) - len(bad)} of {len(judged)} agree{undecided}; {names}"


@dataclass
class ExperimentResult:
    """What one run measured: tables (name -> DataFrame), figures already written (file names), comparisons, notes
    (sentences generated from the numbers or stating the setting), and the run's settings."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)


Runner = Callable[[Path, bool, Sequence[str] | None, int, str], ExperimentResult]


@dataclass(frozen=True)
class Experiment:
    """One reproduction: its name on the command line, what it reproduces, where, and how long it takes here.

    run(out, quick, workloads, seed, device) measures (figures are written into ``out`` as they are drawn) and
    returns the result; ``devices`` names the torch devices it can run on (most run on the CPU only). ``quick_s`` /
    ``full_s``: the quick and full sizes' run time on one core of this project's 2-core CPU machine, estimated from
    CPU time measured there (the machine was shared: wall time under load was several times longer), so
    indicative.
    """

    name: str
    title: str
    source: str
    run: Runner
    quick_s: float
    full_s: float
    workloads: tuple[str, ...] = ()
    devices: tuple[str, ...] = ("cpu",)


def write_result(exp: Experiment, result: ExperimentResult, out: str | os.PathLike, seconds: float) -> Path:
    """Write the tables, ``comparison.csv`` and ``README.md`` of ``result`` into ``out``; return the README path."""
    out = Path(out)
    for name, table in result.tables.items():
        if name.endswith("_steps"):  # per-step data: CSV only (a Markdown twin of thousands of rows helps nobody)
            atomic_write_text(out / f"{name}.csv", table.to_csv(index=False))
        else:
            write_table(table, out, name)
    comp = comparison_table(result.comparisons)
    atomic_write_text(out / "comparison.csv", comp.to_csv(index=False))
    lines = [
        f"# {exp.title}",
        "",
        f"Source: {exp.source}.",
        "",
        "Settings: " + ", ".join(f"{k} = {v}" for k, v in result.settings.items()) + f"; ran {seconds:.0f} s.",
        "",
        "## Paper vs ours",
        "",
        to_markdown(comp) if len(comp) else "No published number to compare with (see the source above).\n",
        f"{VERDICT}{overall_verdict(result.comparisons)}.",
        "",
    ]
    if result.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in result.notes] + [""]
    files = [f"{n}.csv" for n in result.tables] + list(result.figures)
    lines += ["## Files", ""] + [f"- [{f}]({f})" for f in files] + [""]
    return atomic_write_text(out / "README.md", "\n".join(lines))


def run_experiment(
    exp: Experiment,
    out: str | os.PathLike,
    quick: bool = False,
    workloads: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[ExperimentResult, Path]:
    """Run ``exp`` into ``out`` (created) and write its result; returns the result and the README path."""
    if device not in exp.devices:
        raise ValueError(f"experiment {exp.name} runs on {', '.join(exp.devices)} only, not on device {device!r}")
    if workloads is not None and exp.workloads:
        unknown = [w for w in workloads if w.partition(":")[0] not in exp.workloads]
        if unknown:
            raise ValueError(
                f"experiment {exp.name}: workload(s) {', '.join(unknown)} not supported; "
                f"choose from {', '.join(exp.workloads)}"
            )
    elif workloads and not exp.workloads:
        raise ValueError(f"experiment {exp.name} has a fixed setting and takes no --workload")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the experiments run many small steps: one thread is faster on a shared CPU
    try:
        result = exp.run(out, quick, workloads, seed, device)
    finally:
        torch.set_num_threads(threads)
    result.settings.setdefault("size", "quick" if quick else "full")
    result.settings.setdefault("seed", seed)
    return result, write_result(exp, result, out, time.perf_counter() - start)
