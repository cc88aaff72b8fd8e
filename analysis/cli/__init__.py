"""The ``gradstat`` command line (click). One module per command family, registered in :mod:`gradstat.analysis.cli.main`."""
