"""``gradstat bench TOPIC``: run a benchmark module ``analysis/bench/<topic>.py`` and print/write its table.

Each benchmark module exposes ``run(**options) -> pandas.DataFrame``; ``--set key=value`` sets an option, converted
to the type of that option's default. Results are ratios against a baseline measured in the same run.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import pandas as pd


def _topics() -> list[str]:
    import gradstat.analysis.bench as bench

    found = []
    for m in pkgutil.iter_modules(bench.__path__):
        if m.name.startswith("_"):
            continue
        if hasattr(importlib.import_module(f"gradstat.analysis.bench.{m.name}"), "run"):  # helpers are no topics
            found.append(m.name)
    return sorted(found)


def _convert(value: str, default: object, key: str) -> object:
    if isinstance(default, bool):
        if value.lower() in ("1", "true", "yes"):
            return True
        if value.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"--set {key}: expected true/false, got {value!r}")
    if isinstance(default, (list, tuple)):
        item = type(default[0]) if default else str
        return [item(v) for v in value.split(",") if v]
    if isinstance(default, (int, float)):
        try:
            return (
                type(default)(float(value))
                if isinstance(default, int) and "e" in value.lower()
                else type(default)(value)
            )
        except ValueError:
            raise ValueError(f"--set {key}: expected {type(default).__name__}, got {value!r}") from None
    return value


@click.command("bench")
@click.argument("topic", required=False)
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help="Set a benchmark option.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the table as CSV.")
def bench(topic: str | None, settings: tuple[str, ...], out: Path | None) -> None:
    """Run benchmark TOPIC (omit it to list topics and their options)."""
    topics = _topics()
    if topic is None:
        for t in topics:
            mod = importlib.import_module(f"gradstat.analysis.bench.{t}")
            opts = ", ".join(
                f"{p.name}={_setting(p.default)}"
                for p in inspect.signature(mod.run).parameters.values()
                if p.default is not inspect.Parameter.empty
            )
            click.echo(
                f"{t}: {(mod.__doc__ or '').strip().splitlines()[0] if mod.__doc__ else ''}\n    options: {opts}"
            )
        return
    if topic not in topics:
        raise ValueError(f"unknown benchmark {topic!r}; known: {', '.join(topics)}")
    mod = importlib.import_module(f"gradstat.analysis.bench.{topic}")
    params = inspect.signature(mod.run).parameters
    kwargs: dict[str, object] = {}
    for item in settings:
        key, eq, value = item.partition("=")
        if not eq or key not in params:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(params)}")
        kwargs[key] = _convert(value, params[key].default, key)
    table = _interruptible(mod.run, kwargs)
    import pandas as pd

    with pd.option_context("display.max_rows", 500, "display.max_columns", 50, "display.width", 200):
        click.echo(table.to_string(index=False))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
        click.echo(f"wrote {out}")
    if table.attrs.get("interrupted"):
        raise SystemExit(130)  # (stopped: what was measured is printed and written, and the exit says it is partial)


def _interruptible(run: Callable[..., pd.DataFrame], kwargs: dict[str, object]) -> pd.DataFrame:
    """``run(**kwargs)`` with SIGTERM (a time limit's, e.g. ``timeout``) raised as the KeyboardInterrupt that Ctrl-C
    raises: a benchmark that keeps its rows on an interruption (``attrs["interrupted"]``) returns them, to be
    printed and written like a whole table. Elsewhere than the main thread, SIGTERM keeps its handler."""
    if threading.current_thread() is not threading.main_thread():
        return run(**kwargs)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return run(**kwargs)
    finally:
        signal.signal(signal.SIGTERM, previous)


COMMANDS = (bench,)
"""The commands (and groups) this module adds to ``gradstat``, in listing order."""


def _setting(value: object) -> str:
    """An option's default as it is written with ``--set key=value`` (lists comma-separated, no Python reprs)."""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)
