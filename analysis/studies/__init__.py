"""Studies: one module per family of tables computed from gradients.

Every study module follows one contract: its computing functions return pandas frames and take an ``on_rows`` or
``progress`` hook where they are long; its ``run(..., out, ...)`` computes the study, writes its tables (CSV with a
Markdown twin, through :mod:`gradstat.analysis.measure.tables`) and figures (through :mod:`gradstat.analysis.plots`)
into ``out`` and returns the frames. The commands and the report call ``run``, so both write the same files.

- :mod:`~gradstat.analysis.studies.fits`: distribution fits of |g| (``fits.csv``, ``fit_*.png``);
- :mod:`~gradstat.analysis.studies.thresholds`: k_hat/k of threshold estimators (``threshold_*.csv``, ``.png``);
- :mod:`~gradstat.analysis.studies.replay`: compressors replayed over a dump (``compress_*.csv``);
- :mod:`~gradstat.analysis.studies.variance`: Monte Carlo error vs closed-form bound (``variance.csv``);
- :mod:`~gradstat.analysis.studies.feedback`: residual vs eta(beta) (``feedback*.csv``, ``*_eta_vs_beta.png``);
- :mod:`~gradstat.analysis.studies.variance_gain`: QCS Fig. 3 with measured points (``variance_vs_gain.png``);
- :mod:`~gradstat.analysis.studies.bounds`: which closed-form bound applies to a compressor (shared by the studies).

The studies do not import one another, except ``bounds`` and the error samplers of ``variance``, which others reuse.
"""
