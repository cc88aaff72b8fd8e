"""A tiny dump recorded once per test session: fc300, 3 steps, 2 workers, Top-k with error feedback in the loop
(so the extras ``residual`` and ``compensated`` exist)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dump(tmp_path_factory):
    from gradstat.analysis.training.recorder import record

    path = tmp_path_factory.mktemp("dumps") / "fc300"
    record("fc300", 3, workers=2, out=path, seed=0, compressor="topk:ratio=0.01", feedback="ef", progress=False)
    return path
