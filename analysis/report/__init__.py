"""The Markdown report, rows -> Markdown: :mod:`~gradstat.analysis.report.document` runs the studies and collects
what they measured into a :class:`~gradstat.analysis.report.data.ReportData`; :mod:`~gradstat.analysis.report.render`
turns those rows, and nothing else, into the text."""
