"""The installed package: ``gradstat``, ``gradstat.theory``, ``gradstat.compressors`` and ``gradstat.analysis``,
nothing generic at the top level, and a user's own ``theory.py`` (or ``compressors.py``, ``analysis.py``) in the
working directory breaks nothing.

The quick check installs into a target folder (``pip install --target``); the slow ones install into fresh virtual
environments, regular and editable (``--system-site-packages`` so that torch is not downloaded again; no pip in the
venv: the running interpreter's pip installs into it with ``--python``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "gradstat", "theory", "compressors", "analysis")
CHECK = """
import importlib.util, sys
import gradstat, gradstat.compressors, gradstat.theory, gradstat.analysis.cli.main
for name in ("analysis", "compressors", "theory"):
    spec = importlib.util.find_spec(name)
    assert spec is None or spec.origin.startswith(sys.argv[1]), f"top-level {name} importable from {spec.origin}"
c = gradstat.compressors.create("sidco:dist=gp,ratio=0.1,stages=2")
print(gradstat.__file__)
print(gradstat.compressors.__file__)
print(c.dist)
"""


def _copy_sources(dest: Path) -> Path:
    """The files a build needs, copied out of the checkout (a build writes ``build/`` and ``*.egg-info``)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    dest.mkdir()
    for name in SOURCES:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(
            src, dest / name, **({"ignore": ignore} if src.is_dir() else {})
        )
    return dest


def _workdir_with_strays(path: Path) -> Path:
    """A working directory holding a user's own ``theory.py``, ``compressors.py`` and ``analysis.py``."""
    path.mkdir()
    for name in ("theory", "compressors", "analysis"):
        (path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    return path


def _check(python: str, cwd: Path, env: dict[str, str]) -> list[str]:
    run = subprocess.run([python, "-c", CHECK, str(cwd)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def _pip(python: str, *args: str) -> None:
    """This interpreter's pip installs into ``python``'s environment, built with this interpreter's setuptools."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-build-isolation", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=_clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    assert run.returncode == 0, run.stderr


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


def test_pip_install_target_puts_only_gradstat_at_the_top_level(tmp_path):
    src = _copy_sources(tmp_path / "src")
    target = tmp_path / "site"
    _pip(sys.executable, "--target", str(target), str(src))
    top = sorted(p.name for p in target.iterdir() if p.name not in ("bin", "__pycache__"))
    assert top == ["gradstat", "gradstat-0.1.0.dist-info"]
    cwd = _workdir_with_strays(tmp_path / "work")
    init, comp, dist = _check(sys.executable, cwd, _clean_env(PYTHONPATH=str(target)))
    assert init == str(target / "gradstat" / "__init__.py")
    assert comp == str(target / "gradstat" / "compressors" / "__init__.py") and dist == "genpareto"


@pytest.mark.slow  # about 10 s each on an idle machine, 20 s on 2 shared cores
@pytest.mark.parametrize("editable", [False, True], ids=["regular", "editable"])
def test_fresh_venv_install(tmp_path, editable):
    src = _copy_sources(tmp_path / "src")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = str(env_dir / "bin" / "python")
    _pip(python, *(["-e"] if editable else []), str(src))
    cwd = _workdir_with_strays(tmp_path / "work")
    init, comp, dist = _check(python, cwd, _clean_env())
    home = src if editable else env_dir
    assert init.startswith(str(home)) and comp.startswith(str(home)) and dist == "genpareto"
    assert ("site-packages" in comp) != editable
