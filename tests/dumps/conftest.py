"""Fixtures for the dump tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from _dumpkit import write_dump


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The suite shares 2 cores with other jobs: intra-op threads only add contention here."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def dump_path(tmp_path: Path) -> Path:
    path = tmp_path / "dump"
    write_dump(path)
    return path
