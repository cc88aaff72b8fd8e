"""The documentation site, built once per test session when the docs tools are installed (``pip install -e
".[docs]"``); the tests that need it skip with the reason otherwise."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """``mkdocs build --strict`` (warnings are errors: broken links, missing references, unknown snippets) into a
    temporary folder; the built site's folder."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        pytest.skip('the docs tools are not installed (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    return out
