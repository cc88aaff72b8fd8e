"""The validation table: run the selected checks and write ``validation.csv`` (and its Markdown twin) as they finish."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from gradstat.analysis.measure.sources import GradientSource
from gradstat.analysis.measure.tables import atomic_write_text, write_table
from gradstat.analysis.measure.verdicts import Size
from gradstat.analysis.validation.engine import Result, run_checks
from gradstat.analysis.validation.registry import select


def run(
    out: Path,
    size: Size,
    source: GradientSource | None,
    device: torch.device,
    seed: int = 0,
    checks: str | None = None,
    echo: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Run the checks (``analysis.validation``), writing ``validation.csv`` after each one."""
    rows: list[dict] = []

    def done(r: Result) -> None:
        rows.append(r.row())
        atomic_write_text(out / "validation.csv", pd.DataFrame(rows).to_csv(index=False))
        if echo is not None:
            e = r.estimate
            echo(
                f"  {r.check.name:28s} {r.verdict:9s} theory={_fmt(r.theory)} empirical="
                f"{'-' if e is None else f'{e.mean:.4g} [{e.low:.4g}, {e.high:.4g}]'} ({r.seconds:.1f}s)"
            )

    run_checks(select(checks), size, seed, device, source, on_result=done)
    df = pd.DataFrame(rows)
    write_table(df, out, "validation")
    return df


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"
