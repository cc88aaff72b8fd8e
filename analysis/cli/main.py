"""Entry point of the ``gradstat`` command.

Each command family lives in its own module and exposes ``register(group)``; this module only assembles them
and turns user errors (``ValueError``, ``OSError``) into a one-line message and exit status 2, so a wrong input
never prints a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

COMMAND_MODULES = (
    "gradstat.analysis.cli.dump_cmds",
    "gradstat.analysis.cli.theory_cmds",
    "gradstat.analysis.cli.compressor_cmds",
    "gradstat.analysis.cli.analysis_cmds",
    "gradstat.analysis.cli.bench_cmds",
    "gradstat.analysis.cli.experiment_cmds",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gradstat")
def cli() -> None:
    """gradstat: statistics and theory validation for gradient compression."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(cli)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 check failed, 2 bad input)."""
    try:
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


if __name__ == "__main__":
    sys.exit(main())
