"""The ``gradstat`` command line (click): one module per command family, registered in
:mod:`gradstat.analysis.cli.main`."""
