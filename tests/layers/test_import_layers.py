"""The import layers of ``pyproject.toml`` ([tool.importlinter]) hold, and a planted upward arrow is caught.

import-linter walks a package's folder; gradstat's three layers live beside ``gradstat/`` in the source tree (a regular
install puts them inside it), so the contracts are checked on a staging folder that arranges the checkout as installed:
``gradstat/__init__.py`` with ``theory``, ``compressors`` and ``analysis`` linked (or, for the planted arrow, copied).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("theory", "compressors", "analysis")
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def stage(tmp: Path, copy: tuple[str, ...] = ()) -> Path:
    pkg = tmp / "gradstat"
    pkg.mkdir()
    shutil.copy(ROOT / "gradstat" / "__init__.py", pkg / "__init__.py")
    for layer in LAYERS:
        if layer in copy:
            shutil.copytree(ROOT / layer, pkg / layer, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (pkg / layer).symlink_to(ROOT / layer, target_is_directory=True)
    return tmp


def lint_imports(staging: Path) -> subprocess.CompletedProcess:
    if not Path(LINT).exists():
        pytest.fail("lint-imports is not installed: install the test extras (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(staging)}
    return subprocess.run(
        [LINT, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=staging,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_import_contract_is_kept(tmp_path):
    r = lint_imports(stage(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_an_arrow_planted_from_measure_up_to_a_study_breaks_the_room_order(tmp_path):
    staging = stage(tmp_path, copy=("analysis",))
    planted = staging / "gradstat" / "analysis" / "measure" / "tables.py"
    planted.write_text(planted.read_text() + "\nfrom gradstat.analysis.studies import fits  # planted\n")
    r = lint_imports(staging)
    assert r.returncode != 0
    assert "gradstat.analysis.measure.tables -> gradstat.analysis.studies.fits" in r.stdout


def test_an_arrow_planted_from_theory_up_to_compressors_breaks_the_layers(tmp_path):
    staging = stage(tmp_path, copy=("theory",))
    planted = staging / "gradstat" / "theory" / "qcs.py"
    planted.write_text(planted.read_text() + "\nfrom gradstat.compressors.wire import payload  # planted\n")
    r = lint_imports(staging)
    assert r.returncode != 0
    assert "gradstat.theory.qcs -> gradstat.compressors.wire.payload" in r.stdout


def assert_planted_arrow_breaks(tmp_path, layer: str, module: str, arrow: str) -> None:
    """Append ``import arrow`` to ``layer/module`` in a staged copy of ``layer``: lint-imports fails, naming it."""
    staging = stage(tmp_path, copy=(layer,))
    planted = staging / "gradstat" / layer / module
    planted.write_text(planted.read_text() + f"\nimport {arrow}  # planted\n")
    r = lint_imports(staging)
    assert r.returncode != 0
    source = f"gradstat.{layer}." + module.removesuffix(".py").replace("/", ".")
    assert f"{source} -> {arrow}" in " ".join(r.stdout.split())


@pytest.mark.parametrize(
    ("module", "arrow"),
    [
        ("wire/payload.py", "gradstat.compressors.schemes.sparsifiers.topk"),
        ("base.py", "gradstat.compressors.schemes.sparsifiers.topk"),
        ("schemes/quantizers/qsgd.py", "gradstat.compressors.memory.feedback"),
        ("schemes/lowrank/powersgd.py", "gradstat.compressors.schemes.quantizers.dither"),
        ("memory/feedback.py", "gradstat.compressors.ddp.hook"),
    ],
)
def test_an_arrow_planted_up_through_compressors_concerns_breaks_their_order(tmp_path, module, arrow):
    assert_planted_arrow_breaks(tmp_path, "compressors", module, arrow)


@pytest.mark.parametrize(
    ("module", "arrow"),
    [
        ("kernels/primitives.py", "gradstat.theory.pot"),  # up into the rest of theory
        ("kernels/stage_stats.py", "gradstat.theory.estimators.exceedances"),
        ("kernels/compaction.py", "gradstat.compressors.wire.payload"),  # up into the compressors
    ],
)
def test_an_arrow_planted_from_the_kernels_up_breaks_the_bottom_layer(tmp_path, module, arrow):
    assert_planted_arrow_breaks(tmp_path, "theory", module, arrow)


def test_an_arrow_planted_down_the_kernels_own_order_breaks_it(tmp_path):
    assert_planted_arrow_breaks(tmp_path, "theory", "kernels/fused.py", "gradstat.theory.kernels.primitives")
