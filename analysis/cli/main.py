"""Entry point of the ``gradstat`` command.

Each command family lives in its own module and lists its commands in ``COMMANDS``; this module only assembles them
and turns user errors (``ValueError``, ``OSError``) into a one-line message and exit status 2, so a wrong input
never prints a traceback. Anything else is a bug and keeps its traceback. Warnings (an unfaithful replay, a
growing residual, ...) are printed as one line ``gradstat: warning: ...`` on stderr.
"""

from __future__ import annotations

import sys
import warnings
from typing import TextIO

from gradstat.analysis.measure import huge_pages

huge_pages.request()  # before anything below imports torch and allocates (read once, at its first allocation)

import click  # noqa: E402

from gradstat.analysis.cli import (  # noqa: E402
    analysis_cmds,
    bench_cmds,
    compressor_cmds,
    dump_cmds,
    experiment_cmds,
    theory_cmds,
    train_cmds,
)
from gradstat.analysis.cli.options import HelpGroup  # noqa: E402

COMMAND_MODULES = (dump_cmds, theory_cmds, compressor_cmds, analysis_cmds, bench_cmds, train_cmds, experiment_cmds)
"""The command modules, each listing its commands in ``COMMANDS``; a module that fails to import fails the command
line (none is skipped). They import torch, scipy and pandas only inside their commands, so ``--help`` stays quick."""


@click.group(cls=HelpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gradstat")
def cli() -> None:
    """gradstat: statistics and theory validation for gradient compression."""


for _module in COMMAND_MODULES:
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def walk(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every visible command and group below ``group`` as (path, command), parents before children:
    ``(("fit",), fit)``, ``(("theory",), theory)``, ``(("theory", "qcs"), qcs)``, ..."""
    ctx = click.Context(group)
    out: list[tuple[tuple[str, ...], click.Command]] = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        out.append(((*prefix, name), cmd))
        if isinstance(cmd, click.Group):
            out += walk(cmd, (*prefix, name))
    return out


def leaves() -> list[tuple[str, ...]]:
    """The paths of the commands one runs (groups excluded): ``("fit",)``, ``("theory", "qcs")``, ..."""
    return [path for path, cmd in walk() if not isinstance(cmd, click.Group)]


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 check failed, 2 bad input)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning
            rv = cli.main(args=argv, prog_name="gradstat", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("gradstat: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (ValueError, OSError) as exc:
        click.echo(f"gradstat: error: {exc}", err=True)
        return 2
    except KeyboardInterrupt:
        click.echo("gradstat: interrupted", err=True)
        return 130
    return rv if isinstance(rv, int) else 0


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    click.echo(f"gradstat: warning: {message}", err=True)


if __name__ == "__main__":
    sys.exit(main())
