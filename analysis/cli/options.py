"""The command line's shared vocabulary: one definition of each argument and option that several commands take.

- ``DUMP`` is always the first positional argument (optional where a command can run without a dump);
- ``--steps`` / ``--workers`` / ``--layers`` select what was recorded (``0-5``, ``0,5,10``, ``last:3``, ...);
- ``--iterations N`` is how long a command that trains trains;
- ``--out`` is the result folder (see :mod:`gradstat.analysis.cli.outputs`);
- law names are canonicalised by :func:`gradstat.theory.distributions.names.distribution_name`.

The command listing of every group shows each command's whole first paragraph (click would cut it at the first
period, e.g. after "QCS Fig."), so a summary is never cut mid-sentence.
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

import click

from gradstat.theory.distributions.names import accepted, distribution_name

SELECTION_GRAMMAR = "all | 3 | 0-10 | 0-100:10 | 0,5,10 | first:N | last:N"


def summary(cmd: click.Command) -> str:
    """The command's one-line summary: ``short_help`` or the whole first paragraph of its help, unwrapped."""
    text = cmd.short_help or (cmd.help or "").split("\n\n")[0]
    return " ".join(text.split()).removeprefix("\b ").strip()


class HelpGroup(click.Group):
    """A group whose command listing shows each command's whole summary (wrapped, never truncated)."""

    group_class = type  # subgroups are HelpGroups too

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, summary(cmd)))
        if rows:
            with formatter.section("Commands"):
                _write_rows(formatter, rows)


def _write_rows(formatter: click.HelpFormatter, rows: list[tuple[str, str]], spacing: int = 2) -> None:
    """Two columns as click's ``write_dl`` lays them out, but wrapped at spaces only: click's wrapping also breaks
    after a hyphen ("all-" / "reduce"), which changes the words a reader (and a search) sees."""
    first = min(max(len(name) for name, _ in rows), 30) + spacing
    width = max(formatter.width - formatter.current_indent - first - 2, 10)
    for name, text in rows:
        lines = textwrap.wrap(text, width, break_on_hyphens=False) or [""]
        formatter.write(" " * formatter.current_indent + name)
        if len(name) <= first - spacing:
            formatter.write(" " * (first - len(name)) + lines[0] + "\n")
            rest = lines[1:]
        else:
            formatter.write("\n")
            rest = lines
        for line in rest:
            formatter.write(" " * (formatter.current_indent + first) + line + "\n")


def dump_argument(required: bool = True) -> Callable[[Any], Any]:
    """``DUMP``, the first positional argument of every command that reads a dump."""
    return click.argument("dump", required=required, metavar="DUMP" if required else "[DUMP]")


def steps_option(fn: Any) -> Any:
    return click.option("--steps", default=None, help=f"Recorded steps to use: {SELECTION_GRAMMAR} (default all).")(fn)


def workers_option(fn: Any) -> Any:
    return click.option("--workers", default=None, help="Recorded workers to use, same grammar as --steps.")(fn)


def device_option(fn: Any) -> Any:
    return click.option("--device", default="auto", show_default=True, help="cpu | cuda | cuda:N | auto.")(fn)


def seed_option(fn: Any) -> Any:
    return click.option("--seed", default=0, show_default=True, type=int, help="Base seed of every random draw.")(fn)


def quiet_option(fn: Any) -> Any:
    return click.option("--quiet", is_flag=True, help="No progress bars.")(fn)


def out_option(default: str) -> Callable[[Any], Any]:
    """``--out``: the result folder; gradstat's own earlier result there is replaced, anything else refused."""
    return click.option(
        "--out",
        default=default,
        show_default=True,
        help="Result folder; replaces gradstat's earlier result there, refuses a folder holding other files.",
    )


def selection_options(command: str) -> Callable[[Any], Any]:
    """--steps, --workers, --device, --out, --seed, --quiet (every analysis command on a dump)."""

    def deco(fn: Any) -> Any:
        for opt in (quiet_option, seed_option, out_option(f"gradstat-out/{command}"), device_option, workers_option):
            fn = opt(fn)
        return steps_option(fn)

    return deco


def iterations_option(default: int | None = None) -> Callable[[Any], Any]:
    """``--iterations N``: how many training iterations a command that trains runs."""
    return click.option(
        "--iterations",
        type=int,
        default=default,
        required=default is None,
        show_default=default is not None,
        help="Training iterations to run.",
    )


def check_iterations(iterations: int) -> int:
    if iterations < 1:
        raise ValueError(f"--iterations must be a positive integer, got {iterations}")
    return iterations


def no_steps_count(fn: Any) -> Any:
    """A hidden ``--steps`` on commands that train: it says to use ``--iterations`` (``--steps`` selects steps)."""

    def refuse(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            raise ValueError(
                f"{ctx.info_name}: --steps selects recorded steps in the analysis commands; "
                f"use --iterations {value} for how long to train"
            )

    return click.option("--steps", hidden=True, expose_value=False, callback=refuse, help="Use --iterations.")(fn)


class Distribution(click.ParamType):
    """A law of |g| by any accepted spelling, passed on under its canonical name."""

    name = "law"

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.extra = extra

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(("exponential", "gamma", "genpareto", *self.extra)) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if str(value).strip().lower() in self.extra:
            return str(value).strip().lower()
        try:
            return distribution_name(value, f"--{param.name}" if param is not None else "law")
        except ValueError as exc:
            more = f" or {', '.join(self.extra)}" if self.extra else ""
            raise ValueError(f"{exc}{more}") from None


def law_help(text: str) -> str:
    return f"{text} ({accepted()})."
