"""gradstat analysis layer: gradient dumps, recorder, workloads, replay, fitting, validation, plots, reports, CLI.

May import :mod:`theory` and :mod:`compressors`; nothing imports it back.
"""
