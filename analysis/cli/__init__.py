"""The ``gradstat`` command line (click). One module per command family, registered in :mod:`analysis.cli.main`."""
