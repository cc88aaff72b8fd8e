"""``.ci/gpu``, the prepared check for a CUDA machine: what can be checked without one (it parses, it is executable,
its dry run names every step with the arguments the design asks for and writes nothing, it refuses to run without
a CUDA device)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "gpu"
REPORTS = ROOT / "reports" / "gpu"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def listing() -> set[Path]:
    return set(REPORTS.rglob("*")) if REPORTS.exists() else set()


def test_the_script_is_executable_bash_that_parses():
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")
    parsed = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr


def test_the_dry_run_names_every_step_and_writes_nothing():
    before = listing()
    proc = run("--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert listing() == before
    lines = proc.stdout.splitlines()
    steps = {line.split(" (at most ")[0]: line.split(": ", 1)[1] for line in lines if " (at most " in line}
    assert list(steps) == ["install", "microbench", "suite", "cross-device", "train", "profile"]
    assert steps["install"].endswith("-m pip install --no-deps --no-build-isolation --no-index -e .")
    assert " -m pytest " in steps["suite"] and " -m slow" not in steps["suite"] and " tests/" not in steps["suite"]
    cross = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/**/test_*cross_device*.py"))
    expected = cross or ["-k", "cross_device"]  # the test files by name, or pytest's keyword where none is found
    assert steps["cross-device"].split()[-len(expected) :] == expected
    bench = steps["microbench"].split()
    assert bench[1:6] == ["-m", "gradstat", "bench", "microbench", "--set"]
    assert "device=cuda" in bench and "sizes=2600000,26000000" in bench
    train = steps["train"].split()
    assert train[1:4] == ["-m", "gradstat", "train"]
    assert " --backend nccl --nproc 1 " in steps["train"] and train.count("--compressor") == 3
    profile = steps["profile"].split()
    assert profile[1:5] == ["-m", "gradstat", "bench", "profile"] and "device=cuda" in profile
    assert lines[-1].startswith("summary: reports/gpu/") and lines[-1].endswith(".md (not written: --dry-run)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without CUDA")
def test_without_a_cuda_device_nothing_is_installed_or_run():
    before = listing()
    proc = run()
    assert proc.returncode == 2
    assert "no CUDA device is visible" in proc.stderr and "nothing was installed or run" in proc.stderr
    assert proc.stdout == "" and listing() == before


def test_an_unknown_argument_is_refused():
    proc = run("--fast")
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
