"""The site builds with warnings as errors (the ``site`` fixture runs ``mkdocs build --strict``), offline, with the
Theory page generated from the code's tables and the demo report's own figures."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from gradstat import compressors
from gradstat.analysis.validation.registry import CHECKS
from gradstat.theory.sources import PAPERS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import gradstat_docs  # noqa: E402  (the build's hook module)

sys.path.remove(str(ROOT / "docs" / "hooks"))


def test_the_theory_tables_are_generated_from_the_registries():
    checks = gradstat_docs.checks_markdown()
    assert all(f"<code>{c.name}</code>" in checks for c in CHECKS)
    assert checks.count("\n") == len(CHECKS) + 1  # header, rule, one row per check
    papers = gradstat_docs.papers_markdown()
    assert all(p.title in papers for p in PAPERS)
    table = gradstat_docs.compressors_markdown()
    assert all(f"<code>{compressors.create(n).spec()}</code>" in table for n in compressors.names())


def test_every_closed_form_has_a_row_with_its_source():
    """Each public function of every closed-form module of gradstat.theory (every theory module with an __all__
    but the sources table and the distribution and estimator packages) has a row."""
    import importlib
    import inspect

    modules = sorted(
        f.stem
        for f in (ROOT / "theory").glob("*.py")
        if "__all__" in f.read_text(encoding="utf-8") and f.stem not in ("sources", "__init__")
    )
    assert sorted(gradstat_docs.CLOSED_FORM_MODULES) == modules
    table = gradstat_docs.closed_forms_markdown()
    for name in modules:
        module = importlib.import_module(f"gradstat.theory.{name}")
        for fname in module.__all__:
            if inspect.isfunction(getattr(module, fname)):
                assert f"(reference/theory.md#gradstat.theory.{name}.{fname})" in table
    assert "Theorem 2, eq. (10)" in table  # gamma's source, from its docstring


def test_a_check_added_to_the_registry_appears_on_the_page(monkeypatch):
    from gradstat.analysis.validation import registry

    extra = CHECKS[0].__class__(**{**CHECKS[0].__dict__, "name": "planted-check", "source": "Nowhere eq. (0)"})
    monkeypatch.setattr(registry, "CHECKS", (*CHECKS, extra))
    assert "<code>planted-check</code>" in gradstat_docs.checks_markdown()


def test_the_site_builds_strictly_and_offline(site):
    theory = (site / "theory" / "index.html").read_text(encoding="utf-8")
    assert "gradstat:checks" not in theory and all(f"<code>{c.name}</code>" in theory for c in CHECKS)
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"fonts\.(googleapis|gstatic)\.com", text), f"{page}: a font from a CDN"
    start = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    figures = re.findall(r'src="\.\./demo/([^"]+\.png)"', start)
    assert len(figures) >= 6 and all((site / "demo" / figure).is_file() for figure in figures)


@pytest.mark.parametrize("page", ["own-compressor", "guide/train", "guide/record"])
def test_the_snippets_are_included(site, page):
    html = (site / page / "index.html").read_text(encoding="utf-8")
    assert "--8&lt;--" not in html and "--8<--" not in html and "import" in html


def test_docstrings_are_read_as_written():
    """The griffe extension: roles as code, ``name : description`` entries as descriptions, a type kept as a type,
    a sentence under Returns as a paragraph above the entry sections."""
    pytest.importorskip("griffe", reason="the docs tools are not installed (pip install -e '.[docs]')")
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from griffe_docstrings import rewrite
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    doc = (
        "Open :func:`~gradstat.analysis.dumps.open_dump`, see :mod:`gradstat.theory`::\n\n    code\n\n"
        "Parameters\n----------\nwriter : an open writer.\nn : int\n    the length.\n\n"
        "Returns\n-------\nPath of the dump.\n"
    )
    assert rewrite(doc).split("\n") == [
        "Open `open_dump`, see `gradstat.theory`:",
        "",
        "    code",
        "",
        "",
        "**Returns:** Path of the dump.",
        "",
        "Parameters",
        "----------",
        "writer",
        "    an open writer.",
        "n : int",
        "    the length.",
        "",
    ]
