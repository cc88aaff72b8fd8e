"""gradstat's C extension (theory/kernels/_native.c, built by setup.py at install): its buffer checks, the one
switch that turns it off, the refusal of a stale build, and the package without it: the same compressor outputs
bit for bit in a process where it is absent, and an install from a source tree with no working C compiler.

The equivalence of each C loop with its eager reference is tested beside the loop's Python side
(test_compaction.py, test_counter_dither.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gradstat.theory.kernels import compaction, counter_dither, counter_native, native
from gradstat.theory.kernels.policy import forced

ROOT = Path(__file__).resolve().parents[2]
built = pytest.mark.skipif(not native.built(), reason=f"gradstat's C extension is absent: {native.absent_reason()}")

BLOCK = """
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):  # the extension as a build without a compiler leaves it: not there
    def find_spec(self, name, path, target=None):
        if name == "gradstat.theory.kernels._native":
            raise ImportError("no C extension in this process")
        return None

sys.meta_path.insert(0, _Absent())
from gradstat.theory.kernels import native
assert not native.built() and native.extension() is None
"""

OUTPUTS = """
import hashlib, json, torch
from gradstat import compressors
from gradstat.compressors.context import Context

def digests(specs, n):
    gen = torch.Generator().manual_seed(11)
    u = torch.rand(n, generator=gen) - 0.5
    g = -torch.sign(u) * torch.log1p(-2 * u.abs()) * 3e-3  # Laplace
    side = g + 1e-4 * torch.randn(n, generator=gen)
    out = {}
    for spec in specs:
        c = compressors.create(spec)
        ctx = Context(seed=5, worker=1 if c.properties.needs_side else 0)
        p = c.encode(g, ctx)
        rec = c.decode(p, ctx, side=side if c.properties.needs_side else None)
        out[spec] = [hashlib.sha256(p.to_bytes().numpy().tobytes()).hexdigest(),
                     hashlib.sha256(rec.numpy().tobytes()).hexdigest()]
    return out
"""
SPECS = ["threshold:eta=0.01", "sidco:ratio=0.01", "dqsg", "qsgd", "terngrad", "ndqsg", "qcs"]
"""Compressors whose encode or decode runs a C loop on a CPU: threshold selection (compaction), the counter-dither
quantize and reconstruct loops, NDQSG's nested worker."""
N = 100_003  # many 8- and 16-element steps, and a scalar tail


def _run(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@built
def test_the_c_hash_multipliers_are_the_reference_s():
    assert tuple(native.extension().MULTIPLIERS) == counter_dither.MULTIPLIERS


@built
def test_the_extension_is_the_package_s_own_module():
    """Loaded from the package's own folder (built there by the package build), nothing from a user cache."""
    ext = native.extension()
    assert Path(ext.__file__).parent == Path(native.__file__).parent
    assert ext.SOURCE_DIGEST == hashlib.sha256(native.SOURCE.read_bytes()).hexdigest()


def test_no_code_builds_or_loads_a_shared_library_at_run_time():
    """The compressors and the theory hold no loader of shared libraries and no search for a C compiler."""
    pattern = re.compile(r"\bctypes\b|\bCDLL\b|LoadLibrary|\$CC\b|environ\.get\(\"CC\"|which\(\"(cc|gcc|clang)\"\)")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for layer in ("compressors", "theory")
        for path in sorted((ROOT / layer).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found


@built
def test_buffers_are_checked_before_any_loop_runs():
    ext = native.extension()
    x, scale = np.zeros(64, np.float32), np.ones(8, np.float32)
    codes = np.zeros(64, np.int8)
    key = (1, 2)
    ext.quantize_rows(x, 8, 8, scale, 0, *key, 1.0, -1.0, 1.0, 0.0, codes)  # the well-formed call
    with pytest.raises(TypeError, match="float32"):
        ext.quantize_rows(x.astype(np.float64), 8, 8, scale, 0, *key, 1.0, -1.0, 1.0, 0.0, codes)
    with pytest.raises(ValueError, match="the codes holds 63 elements, expected 64"):
        ext.quantize_rows(x, 8, 8, scale, 0, *key, 1.0, -1.0, 1.0, 0.0, codes[:63])
    with pytest.raises(ValueError, match="the scales holds 8 elements, expected 9"):
        ext.quantize_rows(np.zeros(72, np.float32), 9, 8, scale, 0, *key, 1.0, -1.0, 1.0, 0.0, np.zeros(72, np.int8))
    with pytest.raises(ValueError, match="-1 x 8"):
        ext.quantize_rows(x, -1, 8, scale, 0, *key, 1.0, -1.0, 1.0, 0.0, codes)
    with pytest.raises(TypeError, match="contiguous"):
        ext.reconstruct_rows(codes[::2], 4, 8, scale, 0, *key, 1.0, 0.0, True, x[:32])
    frozen = np.zeros(64, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(TypeError, match="writable"):
        ext.reconstruct_rows(codes, 8, 8, scale, 0, *key, 1.0, 0.0, True, frozen)
    with pytest.raises(ValueError, match="the side information holds 63"):
        ext.nested_estimate(codes, x[:63], 1.0, 0, *key, 1.0, False, 0.1, 5.0, 0.1, x)
    with pytest.raises(TypeError, match="int8"):
        ext.nested_rows(x, 1.0, 0, *key, 1.0, 0.1, 5.0, 2.0, x)
    idx = np.zeros(16, np.int64)
    with pytest.raises(ValueError, match=r"range \[0, 65\) of 64 elements"):
        ext.select_f32(x, 0, 65, 0.5, True, idx, None, 0, -np.inf, False)
    with pytest.raises(ValueError, match="with 17 of 16 entries filled"):
        ext.select_f32(x, 0, 64, 0.5, True, idx, None, 17, -np.inf, False)
    with pytest.raises(TypeError, match="int64"):
        ext.select_f32(x, 0, 64, 0.5, True, idx.astype(np.int32), None, 0, -np.inf, False)
    with pytest.raises(TypeError, match="float64"):
        ext.select_f64(x, 0, 64, 0.5, True, idx, None, 0, -np.inf, False)


def _every_loop(seed: int) -> list[torch.Tensor]:
    """The outputs of every C loop on data that reaches their edge cases (ties, clamping at both ends, signed zeros,
    denormals, NaN for the selection, a length that is no multiple of 8 or 16, a base index near 2^31)."""
    gen = torch.Generator().manual_seed(seed)
    n = 100_003
    x = torch.randn(n, generator=gen)
    x[::97] = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-45, -3e-39, 3e38, 2.0])[torch.arange(0, n, 97) % 8]
    y = x.clone()
    y[5000] = float("nan")
    outs = [t for a in (True, False) for t in compaction.select(y, 1.0, a, gather=True)[:2]]
    key = counter_dither.keys(4, 1, "cpu")
    block = x.view(1, n) * 0.3
    scale = torch.full((1, 1), 0.37)  # (neither the scale nor the gain a power of two: every rounding shows)
    codes = counter_native.quantize_rows_into(torch.empty(1, n, dtype=torch.int8), block, scale, 2**31 - 9, key,
                                              3.0, -3, 3, 0.5)  # fmt: skip
    outs += [codes, counter_native.reconstruct_rows_into(torch.empty(1, n), codes, scale, 7, key, 3.0, 0.5, True)]
    rows = x[: 99 * 1000].view(99, 1000)
    peaks = rows.abs().amax(1, keepdim=True)
    outs.append(counter_native.quantize_rows_into(torch.empty(99, 1000, dtype=torch.int8), rows, peaks, 0, key, 7.0,
                                                  -7, 7, 0.5))  # fmt: skip
    nested = counter_native.nested_rows_into(torch.empty(n, dtype=torch.int8), x, 2.5, key, 0.7, 0.25, 5)
    side = x + 0.1 * torch.randn(n, generator=gen)
    outs += [nested, counter_native.nested_estimate_into(torch.empty(n), nested, side, 2.5, key, 0.7, 0.25, 5)]
    return outs


@built
def test_the_scalar_loops_equal_the_avx2_loops_bit_for_bit():
    """The scalar loops (what a CPU without AVX2 runs, and each loop's tail here) against the AVX2 loops (which the
    other tests hold to the eager references): the same bits, so both equal the references."""
    ext = native.extension()
    if not ext.avx2():
        pytest.skip("no AVX2 on this CPU: the scalar loops are the ones the other tests compare")
    wide = _every_loop(1)
    ext.set_avx2(False)
    try:
        assert not ext.avx2()
        narrow = _every_loop(1)
    finally:
        ext.set_avx2(True)
    assert len(wide) == len(narrow) == 9
    for i, (a, b) in enumerate(zip(wide, narrow, strict=True)):
        assert a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)), i


@built
def test_the_compile_policy_turns_every_loop_off_and_on_in_one_process():
    x, scale = torch.ones(64), torch.ones(1)
    codes = torch.zeros(64, dtype=torch.int8)
    assert compaction.available(x) and counter_native.quantizes(x, scale, torch.int8)
    assert counter_native.reconstructs(codes, scale) and counter_native.nests(x, 5, 0.1)
    with forced("never"):
        assert native.extension() is None and not compaction.available(x)
        assert not counter_native.quantizes(x, scale, torch.int8) and not counter_native.reconstructs(codes, scale)
        assert not counter_native.nests(x, 5, 0.1)
    assert native.extension() is not None and compaction.available(x)


def test_a_build_from_another_source_is_refused_with_one_warning(monkeypatch, tmp_path):
    """An in-place build older than its source (edited since, not rebuilt) is not used: its loops may not be the
    source's."""
    if importlib.util.find_spec("gradstat.theory.kernels._native") is None:
        pytest.skip(f"gradstat's C extension is absent: {native.absent_reason()}")
    source = native.SOURCE.read_text()
    edited = tmp_path / "_native.c"
    edited.write_text(source + "\n/* edited */\n")
    monkeypatch.setattr(native, "SOURCE", edited)
    module, reason, stale = native._load()
    assert module is None and stale and "another version of _native.c: rebuild it" in reason
    monkeypatch.setattr(native, "_EXTENSION", None)
    monkeypatch.setattr(native, "_ABSENT", reason)
    monkeypatch.setattr(native, "_STALE", True)
    monkeypatch.setattr(native, "_WARNED", False)
    with pytest.warns(RuntimeWarning, match="rebuild it"):
        assert native.extension() is None and not compaction.available(torch.ones(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.extension() is None  # warned once per process
    edited.write_text(source)
    assert native._load()[0] is not None  # the same source again: used


def test_without_the_extension_the_compressors_give_the_same_bits():
    """The compressors whose CPU encode or decode runs a C loop, in a process where the extension cannot be imported
    (the package as installed without a compiler) against this process (the extension where it is built): the same
    payload bytes and the same decoded values."""
    here = {}
    exec(compile(OUTPUTS, "outputs", "exec"), here)
    want = here["digests"](SPECS, N)
    got = json.loads(_run(BLOCK + OUTPUTS + f"print(__import__('json').dumps(digests({SPECS!r}, {N})))"))
    assert got == want


def _copy_source(dest: Path) -> Path:
    """The files the package build reads, without anything built (no extension, no caches)."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.egg-info", "build")
    for layer in ("gradstat", "theory", "compressors", "analysis"):
        shutil.copytree(ROOT / layer, dest / layer, ignore=skip)
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def _wheel_and_install(tmp_path: Path, cc: str | None) -> tuple[Path, list[str]]:
    """Build a wheel of the checkout with the C compiler ``cc`` (None: the default one), install it into a folder of
    its own; the folder and the wheel's file names."""
    import setuptools

    if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (70, 1):
        pytest.skip(f"setuptools {setuptools.__version__} builds no wheel without the wheel package")
    src = _copy_source(tmp_path / "src")
    env = {**os.environ, **({"CC": cc} if cc is not None else {})}
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "wheel"), str(src)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("gradstat-*.whl")
    target = tmp_path / "site"
    install = [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return target, zipfile.ZipFile(wheel).namelist()


PROBE = """
import torch
from gradstat.theory.kernels import compaction, native
print(native.__file__)
print(native.built())
print(native.absent_reason())
print(compaction.select(torch.tensor([0.5, -2.0, 3.0]), 1.0, True)[0].tolist() if native.built() else "-")
"""


def test_the_package_installs_and_runs_without_a_c_compiler(tmp_path):
    """``CC=false`` (a compiler that always fails): the wheel builds without the extension, installs, imports, and
    reports the extension absent; its compressors then run their torch and numpy paths."""
    target, files = _wheel_and_install(tmp_path, cc="false")
    assert "gradstat/theory/kernels/native.py" in files and not [f for f in files if "_native." in f and
                                                                       f.endswith((".so", ".pyd"))]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADSTAT_COMPILE")}
    lines = _run(PROBE + "from gradstat import compressors; import torch\n"
                 "c = compressors.create('topk:ratio=0.01'); x = torch.randn(1000)\n"
                 "print(int(c.decode(c.encode(x, compressors.Context()), compressors.Context()).count_nonzero()))",
                 env={**env, "PYTHONPATH": str(target)}, cwd=tmp_path).splitlines()  # fmt: skip
    assert Path(lines[0]).is_relative_to(target) and lines[1] == "False"
    assert lines[2].startswith("the C extension was not built when gradstat was installed") and lines[4] == "10"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_the_package_build_compiles_the_extension_into_the_package(tmp_path):
    """With a compiler: the wheel holds the extension inside gradstat/theory/kernels/, and it is used."""
    target, files = _wheel_and_install(tmp_path, cc=None)
    assert [f for f in files if f.startswith("gradstat/theory/kernels/_native.") and f.endswith(".so")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADSTAT_COMPILE")}
    lines = _run(PROBE, env={**env, "PYTHONPATH": str(target)}, cwd=tmp_path).splitlines()
    assert Path(lines[0]).is_relative_to(target) and lines[1:] == ["True", "None", "[1, 2]"]


PURE_PATH_TESTS = [
    "tests/compressors/test_compaction.py",
    "tests/compressors/test_primitives.py",
    "tests/compressors/test_counter_dither.py",
    "tests/compressors/test_threshold.py",
    "tests/compressors/test_ndqsg.py",
    "tests/compressors/test_qsgd.py",
    "tests/compressors/test_sidco.py",
    "tests/compressors/test_quantizer_fast_paths.py",
]


@pytest.mark.slow
def test_the_compressor_tests_pass_without_the_extension():
    """The tests of the loops' callers in a process where the extension cannot be imported (minutes)."""
    code = BLOCK + "import pytest\nsys.exit(pytest.main(sys.argv[1:]))\n"
    args = ["-q", "-p", "no:cacheprovider", "-m", "not slow", *PURE_PATH_TESTS]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:]
