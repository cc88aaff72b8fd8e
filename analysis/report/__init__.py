"""The Markdown report: a rendering of the tables measured in one run (:mod:`~gradstat.analysis.report.document`)."""
