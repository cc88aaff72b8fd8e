"""Test, lint and type-check sessions: ``nox -l`` lists them, ``nox -s NAME`` runs one (``nox`` alone runs ``tests``,
``lint`` and ``types``). Arguments after ``--`` go to pytest (``nox -s oldest -- -x tests/theory``).

- ``tests``: the README's test command, in the Python that runs nox.
- ``oldest``: the lowest Python and every dependency at its declared floor (``constraints/oldest.txt``).
- ``newest``: the newest Python and the newest release of every dependency that pip installs here.
- ``lint``: ``ruff check``, ``ruff format --check`` and the import-layer contracts (``tests/layers``).
- ``types``: ``mypy`` on the ``gradstat`` package (configuration in ``pyproject.toml``, ``[tool.mypy]``).
- ``docs``: the documentation site (``mkdocs build --strict``) and its tests (``tests/docs``).
- ``slow``: the slow statistical tests (``pytest -m slow``).
- ``cuda``: the GPU tests and benchmarks, on a machine with a CUDA device (fails without one).

The checkers' versions (ruff, mypy) are pinned in ``pyproject.toml``'s extras ``lint`` and ``types``.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")

OLDEST_PYTHON = "3.10"
NEWEST_PYTHON = "3.13"
README_TORCH = "torch==2.13.0"  # the README's install pins the CPU build of torch 2.13.0
CONSTRAINTS_OLDEST = "constraints/oldest.txt"

nox.options.sessions = ["tests", "lint", "types"]


def _find_pyenv_pythons() -> None:
    """Let nox find the interpreters pyenv installed: its ``python3.X`` shims fail for any version that is not
    selected, so append each installed version's own ``bin`` to PATH (after everything already there)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if root.is_dir():
        extra = [str(d / "bin") for d in sorted(root.iterdir()) if (d / "bin").is_dir()]
        os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), *extra])


_find_pyenv_pythons()


def _env() -> dict[str, str]:
    return {"MPLBACKEND": "Agg", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _show_versions(session: nox.Session) -> None:
    """Print the Python and the installed version of every declared dependency (the session's record)."""
    names = "torch numpy scipy pandas matplotlib scikit-learn safetensors click tqdm pytest import-linter"
    code = "import sys; from importlib.metadata import version as v; print('python', sys.version.split()[0]);"
    session.run("python", "-c", code + f"[print(n, v(n)) for n in {names.split()!r}]", silent=False)


PARALLEL = ("-n", "2", "--dist", "loadgroup")
"""The README's test command runs on 2 pytest-xdist workers (CI's 2 cores); tests sharing a fixture stay together."""


def _pytest(session: nox.Session, *args: str) -> None:
    session.run("python", "-m", "pytest", *PARALLEL, *args, *session.posargs, env=_env())


@nox.session
def tests(session: nox.Session) -> None:
    """The README's test command: ``pip install torch==2.13.0 -e ".[test]" && python -m pytest -n 2 --dist
    loadgroup``."""
    session.install(README_TORCH, "-e", ".[test]")
    _show_versions(session)
    _pytest(session)


@nox.session(python=OLDEST_PYTHON)
def oldest(session: nox.Session) -> None:
    """The declared floors: the lowest supported Python and every dependency pinned to its lower bound."""
    session.install("-c", CONSTRAINTS_OLDEST, "-e", ".[test]")
    _show_versions(session)
    _pytest(session)


@nox.session(python=NEWEST_PYTHON)
def newest(session: nox.Session) -> None:
    """The newest Python and the newest release of everything. pip picks the newest torch it may install: on
    Linux x86-64 PyPI carries only the CUDA build (it runs on CPU), and a CPU build wins wherever one of the same
    or a newer version is at hand (a ``+cpu`` local version sorts above the plain one)."""
    session.install("-e", ".[test]")
    _show_versions(session)
    _pytest(session)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and the import-layer contracts; none of it needs torch."""
    session.install(*PYPROJECT["project"]["optional-dependencies"]["lint"])  # the checkers only, not the package
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # tests/conftest.py imports torch for the device fixtures; the layer tests use none of them.
    session.run("python", "-m", "pytest", "--noconftest", "tests/layers", env=_env())


@nox.session
def types(session: nox.Session) -> None:
    """mypy on the ``gradstat`` package with the README's torch (the one the type stubs are checked against)."""
    session.install(README_TORCH, "-e", ".[types]")
    session.run("mypy", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site, built offline with warnings as errors, then its tests (every example of the site)."""
    session.install(README_TORCH, "-e", ".[docs,test]")
    session.run("mkdocs", "build", "--strict", "--site-dir", str(Path(session.create_tmp()) / "site"))
    _pytest(session, "tests/docs")


@nox.session
def slow(session: nox.Session) -> None:
    """The slow statistical tests (larger Monte Carlo runs, full-size checks)."""
    session.install(README_TORCH, "-e", ".[test]")
    _show_versions(session)
    _pytest(session, "-m", "slow")


@nox.session
def cuda(session: nox.Session) -> None:
    """GPU tests and benchmarks. Installs the torch pip resolves (on Linux x86-64 the CUDA build) unless one is
    named: ``nox -s cuda -- torch==X`` (other arguments go to pytest). Fails where no CUDA device is visible (the
    skipped tests would pass silently). The benchmark tables are written to ``.nox/cuda-bench/``."""
    torch = [a for a in session.posargs if a.startswith("torch")]
    session.install(*torch, "-e", ".[test]")
    _show_versions(session)
    session.run("python", "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')")
    pytest_args = [a for a in session.posargs if a not in torch]
    session.run("python", "-m", "pytest", "-m", "cuda", *pytest_args, env=_env())
    out = ROOT / ".nox" / "cuda-bench"
    for topic in ("compressors", "estimators"):
        session.run(
            "python", "-m", "gradstat", "bench", topic, "--set", "device=cuda", "--out", str(out / f"{topic}.csv")
        )
