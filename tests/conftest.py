"""Shared fixtures: devices (CPU always, CUDA when present) and the `cuda` marker's skip."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
DEVICE_PARAMS = [pytest.param(d, marks=[pytest.mark.cuda] if d == "cuda" else [], id=d) for d in DEVICES]
"""The ``device`` fixture's parameters: the CUDA case carries the ``cuda`` marker, so ``pytest -m cuda`` selects
every device test's CUDA run (and ``-m "not cuda"`` leaves them out)."""


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread per test module: the suite's tensors are small, so a second thread only adds
    scheduling overhead and timing noise on a 2-core machine (CI's size)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=DEVICE_PARAMS)
def device(request) -> torch.device:
    """Every device present: the same test runs on CPU and, where available, on CUDA (marked ``cuda``)."""
    return torch.device(request.param)
