"""The documentation site, built once per test session when the docs tools are installed (``pip install -e
".[docs]"``); the tests that need it skip with the reason otherwise."""

from __future__ import annotations

import importlib.util
import os
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
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    return out


@pytest.fixture(scope="session")
def ddp_examples(tmp_path_factory) -> dict:
    """The site's DDP examples run once on 2 gloo ranks: ``{"rows": [rank 0's, rank 1's], "out": folder}``, each
    rank's value a dict of the examples' returned rows (see ``_ddp_examples.py``)."""
    paths = [str(DOCS / "examples"), str(ROOT / "tests" / "distributed"), str(Path(__file__).parent)]
    sys.path[:0] = paths  # the spawned ranks start with this path
    before = set(sys.modules)
    try:
        from _ddp_examples import run_examples
        from _ranks import run_ranks

        out = tmp_path_factory.mktemp("ddp-examples")
        rows = run_ranks(run_examples, world=2, out=str(out))
    finally:
        for p in paths:
            sys.path.remove(p)
        for name in {"_ranks", "_ddp_examples"} - before:
            sys.modules.pop(name, None)
    return {"rows": rows, "out": out}
