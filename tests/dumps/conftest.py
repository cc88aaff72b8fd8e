"""Fixtures for the dump tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from _dumpkit import write_dump


@pytest.fixture
def dump_path(tmp_path: Path) -> Path:
    path = tmp_path / "dump"
    write_dump(path)
    return path
