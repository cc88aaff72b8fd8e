"""The ``gradstat`` command line (click): one module per command family, each listing its commands in ``COMMANDS``,
assembled in :mod:`gradstat.analysis.cli.main`. Each command is one function that imports what it needs when it
runs (torch, scipy and pandas included), so ``gradstat --help`` and every ``COMMAND --help`` load none of them."""
