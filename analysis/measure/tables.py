"""Tables: a pandas DataFrame written as CSV and Markdown (atomically) and pretty-printed in the terminal.

Every table the analysis layer produces goes through :func:`write_table`, so each CSV has a Markdown twin for the
report and an interruption never leaves a half-written file (each file is written to a temporary name and renamed).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd


def format_value(v: object, digits: int = 4) -> str:
    """One cell as text: floats with ``digits`` significant digits, NaN as an empty cell."""
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return ""
        return f"{v:.{digits}g}"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    return str(v)


def plain(value: object) -> str:
    """A manifest value as a person reads it: ``k=v, ...`` for mappings (``;`` between items when a value, such as
    a compressor spec, holds commas itself), brackets for lists, 6 significant digits
    for floats, ``none`` for None (never a Python repr)."""
    if isinstance(value, dict):
        items = [f"{k}={plain(v)}" for k, v in value.items() if v is not None]
        return ("; " if any("," in i for i in items) else ", ").join(items)  # specs hold commas themselves
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(plain(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "none"}[value]
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def to_markdown(df: pd.DataFrame, digits: int = 4) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (index dropped; ``|`` in cells escaped)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(format_value(v, digits).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines) + "\n"


def to_text(df: pd.DataFrame, digits: int = 4, max_rows: int = 60) -> str:
    """Terminal rendering: aligned columns, floats to ``digits`` significant digits, long tables truncated."""
    shown = df if len(df) <= max_rows else df.head(max_rows)
    text = shown.map(lambda v: format_value(v, digits)).to_string(index=False)
    if len(df) > max_rows:
        text += f"\n... ({len(df) - max_rows} more rows in the CSV)"
    return text


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    Raises
    ------
    OSError : the same errno, its message naming ``path`` (a full disk fails inside ``write``, whose error names no
        file); the temporary file is removed and ``path`` left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, f"{path}: cannot write ({exc.strerror or exc}); it was left as it was") from exc
    return path


def write_table(df: pd.DataFrame, out_dir: str | os.PathLike, stem: str, digits: int = 4) -> dict[str, Path]:
    """Write ``df`` as ``<out_dir>/<stem>.csv`` (full precision) and ``<stem>.md``; return both paths.

    Raises
    ------
    ValueError : ``stem`` empty or containing a path separator.
    """
    if not stem or "/" in stem or os.sep in stem:
        raise ValueError(f"table stem must be a plain file name, got {stem!r}")
    out = Path(out_dir)
    csv = atomic_write_text(out / f"{stem}.csv", df.to_csv(index=False))
    md = atomic_write_text(out / f"{stem}.md", to_markdown(df, digits))
    return {"csv": csv, "md": md}


class CsvLog:
    """Rows appended to a CSV as they come (nothing lost on interruption); the header is fixed by the first row."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] | None = None
        self._fh: TextIO | None = None

    def add(self, rows: dict | list[dict]) -> None:
        rows = [rows] if isinstance(rows, dict) else rows
        if not rows:
            return
        if self._fh is None:
            self.columns = list(rows[0])
            self._fh = open(self.path, "w", encoding="utf-8")
            self._fh.write(",".join(self.columns) + "\n")
        columns = self.columns if self.columns is not None else []  # set with the file
        for r in rows:
            self._fh.write(",".join(_csv_cell(r.get(c)) for c in columns) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _csv_cell(v: Any) -> str:
    s = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
    return f'"{s}"' if ("," in s or '"' in s) else s
