"""Benchmarks: each module ``gradstat.analysis.bench.<topic>`` exposes ``run(**options) -> pandas.DataFrame`` and a
module-level ``OPTIONS`` docstring; ratios are taken against a baseline measured in the same run. Run them with
``gradstat bench <topic>``."""
