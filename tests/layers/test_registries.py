"""Registries import their members by name: a member that fails to import fails its registry loudly (no module is
skipped because an import error was swallowed)."""

from __future__ import annotations

import importlib
import sys

import pytest

REGISTRIES = [
    ("gradstat.compressors", "gradstat.compressors.schemes.sparsifiers.topk"),
    ("gradstat.analysis.experiments.registry", "gradstat.analysis.experiments.gmc"),
    ("gradstat.analysis.validation.registry", "gradstat.analysis.validation.checks.sidco"),
    ("gradstat.analysis.cli.main", "gradstat.analysis.cli.bench_cmds"),
]


@pytest.mark.parametrize("registry, member", REGISTRIES, ids=[r for r, _ in REGISTRIES])
def test_a_member_that_cannot_be_imported_fails_its_registry(monkeypatch, registry, member):
    importlib.import_module(registry)  # the registry as it is imports
    monkeypatch.setitem(sys.modules, member, None)  # the member now fails to import (ModuleNotFoundError)
    monkeypatch.delitem(sys.modules, registry)
    parent, _, leaf = member.rpartition(".")
    if hasattr(sys.modules[parent], leaf):  # `from package import member` would find the attribute
        monkeypatch.delattr(sys.modules[parent], leaf)
    with pytest.raises(ImportError, match=member.replace(".", r"\.")):
        importlib.import_module(registry)
