"""The API reference has an entry for every public name: each name in a module's ``__all__`` (every module of the
package that declares one) is an anchor of the built reference, under its public path (``gradstat.compressors.
Compressor``) or the path where it is defined (``gradstat.compressors.base.Compressor``)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("theory", "compressors", "analysis")


def _module_name(path: Path) -> str:
    """``compressors/ddp/__init__.py`` -> ``gradstat.compressors.ddp``; ``gradstat/__init__.py`` -> ``gradstat``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "gradstat" else ["gradstat", *parts])


def public_names() -> dict[str, list[str]]:
    """Module name -> its ``__all__``, read from the source (every module of the package that declares one)."""
    files = [ROOT / "gradstat" / "__init__.py"] + [f for layer in LAYERS for f in sorted((ROOT / layer).rglob("*.py"))]
    found = {}
    for f in files:
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                found[_module_name(f)] = list(ast.literal_eval(node.value))
    return found


def anchors(site: Path) -> set[str]:
    ids = set()
    for page in (site / "reference").rglob("*.html"):
        ids.update(re.findall(r'id="(gradstat\.[^"]+)"', page.read_text(encoding="utf-8")))
    return ids


def accepted_paths(module: str, name: str) -> set[str]:
    """The public path of ``name`` and, for a class or function, the path where it is defined."""
    paths = {f"{module}.{name}"}
    obj = getattr(importlib.import_module(module), name, None)
    if hasattr(obj, "__qualname__") and hasattr(obj, "__module__"):
        paths.add(f"{obj.__module__}.{obj.__qualname__}")
    return paths


def test_the_public_modules_are_found():
    names = public_names()
    assert {"gradstat", "gradstat.compressors", "gradstat.compressors.ddp", "gradstat.analysis.dumps"} <= set(names)
    assert "make_hook" in names["gradstat.compressors.ddp"]


def test_every_public_name_has_a_reference_entry(site):
    ids = anchors(site)
    missing = [
        f"{module}.{name}"
        for module, names in public_names().items()
        for name in names
        if not accepted_paths(module, name) & ids
    ]
    assert not missing, f"public names without an entry in the API reference: {missing}"


def test_the_reference_check_fails_on_a_name_without_an_entry(site):
    """The check can fail: a name that is not documented anywhere is reported."""
    assert not accepted_paths("gradstat.theory.sources", "cite") - {"gradstat.theory.sources.cite"}
    assert "gradstat.theory.sources.no_such_name" not in anchors(site)
