"""The ``gradstat`` command tree, walked from the click group (shared by the command-line tests)."""

from __future__ import annotations

import click

from gradstat.analysis.cli.main import cli


def commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every command and group below ``group`` (not hidden), as (path, command), parents before children."""
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        out.append(((*prefix, name), cmd))
        if isinstance(cmd, click.Group):
            out += commands(cmd, (*prefix, name))
    return out


def leaves() -> list[tuple[str, ...]]:
    """The paths of the commands one runs (groups excluded): ``("fit",)``, ``("theory", "qcs")``, ..."""
    return [path for path, cmd in commands() if not isinstance(cmd, click.Group)]
