"""The one way a figure leaves the program: PNG and the CSV of the data drawn, written side by side."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # never a window; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gradstat.analysis.measure.tables import atomic_write_text  # noqa: E402

DPI = 90
"""Resolution of written PNGs (kept small: the committed report must stay a few hundred KB)."""


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.6) -> tuple[Figure, np.ndarray]:
    """A figure with ``nrows x ncols`` axes of ``width x height`` inches each; returns ``(fig, axes)``."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, axes


def log_axis(axis: Axis, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """Readable log axis: major ticks at 1, 2, 5 x 10^k written as plain numbers (0.01, 0.2, 5, 100), no minor
    labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def legend_outside(ax: Axes, fontsize: int = 7, source: Axes | None = None) -> None:
    """The legend to the right of ``ax``, outside the data; ``source`` (another axes) supplies the entries."""
    handles, labels = (source or ax).get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def save_figure(fig: Figure, data: pd.DataFrame, out_dir: str | os.PathLike, stem: str) -> dict[str, Path]:
    """Write ``<stem>.png`` and ``<stem>.csv`` (the data behind the figure) into ``out_dir``; close the figure."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{stem}.png"
    tmp = out / f".{stem}.tmp{os.getpid()}.png"
    try:
        fig.tight_layout()
        fig.savefig(tmp, dpi=DPI, bbox_inches="tight")  # keeps legends placed outside the axes
        os.replace(tmp, png)
    except OSError as exc:  # a full disk fails inside write, whose error names no file
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, f"{png}: cannot write ({exc.strerror or exc}); it was left as it was") from exc
    finally:
        plt.close(fig)
    csv = atomic_write_text(out / f"{stem}.csv", data.to_csv(index=False))
    return {"png": png, "csv": csv}
