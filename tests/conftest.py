"""Shared fixtures: devices (CPU always, CUDA when present) and the `cuda` marker's skip."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
DEVICE_PARAMS = [pytest.param(d, marks=[pytest.mark.cuda] if d == "cuda" else [], id=d) for d in DEVICES]
"""The ``device`` fixture's parameters: the CUDA case carries the ``cuda`` marker, so ``pytest -m cuda`` selects
every device test's CUDA run (and ``-m "not cuda"`` leaves them out)."""


COMPILING = "compiled kernels"
"""The worker group of the test files that build the most ``torch.compile`` kernels (:data:`COMPILING_FILES`)."""
COMPILING_FILES = frozenset(
    {
        "tests/kernels/test_equivalence.py",
        "tests/compressors/test_counter_dither.py",
        "tests/compressors/test_counter_subset.py",
        "tests/theory/test_fused.py",
    }
)
"""Files whose tests compile the kernels of ``theory/kernels``: each compiled kernel builds each of its variants
(dtype, constants; shapes are dynamic) once per process, so these files on two workers built every variant twice
(torch.compile's tracing, and its code generation too while the disk cache is cold). Measured on this 2-core
machine under ``-n 2 --dist loadgroup``, warm cache: the battery alone 25-28 s of CPU on one worker against 36 s
spread over two; the four files 37 s on one worker against 44 s with only the battery grouped."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not HAS_CUDA and "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))
        group = shared_fixture_group(item)
        if group is None and item.nodeid.split("::")[0] in COMPILING_FILES:
            group = COMPILING
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def shared_fixture_group(item: pytest.Item) -> str | None:
    """The worker group of ``item`` under ``pytest -n N --dist loadgroup`` (the README's test command): a test that
    uses a shared fixture (a recorded dump, a DDP launch, the built site) runs on the worker that builds it. The
    group is the folder of a session fixture's ``conftest.py`` (the widest scope), else the test's file when it
    uses a module fixture; None (scheduled alone, wherever a worker is free) when it uses neither. pytest's own
    fixtures and this file's (one thread per module: cheap) group nothing."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    session = module = None
    for defs in info.name2fixturedefs.values():
        fixture = defs[-1]
        if fixture.scope == "function" or fixture.baseid in ("", "tests"):
            continue
        if fixture.scope in ("session", "package"):
            session = session or fixture.baseid
        else:
            module = module or item.nodeid.split("::")[0]
    return session or module


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
