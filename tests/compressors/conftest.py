"""Fixtures shared by the compressor tests."""

from __future__ import annotations

import pytest

from gradstat.theory.kernels import native


@pytest.fixture(params=["one piece", "3 pieces"])
def native_split(request, monkeypatch):
    """The C loops on one piece, or split into 3 pieces on their thread pool from 64 elements up (joined in
    order): every piece boundary, hand-off and per-piece buffer is exercised on small inputs."""
    if request.param != "one piece":
        monkeypatch.setattr(native, "PARALLEL_MIN", 64)
        monkeypatch.setattr(native.torch, "get_num_threads", lambda: 3)
    return request.param
