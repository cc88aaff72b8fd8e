"""Hostile dump and import files: each is refused with a one-line ``gradstat: error: ...`` and exit status 2,
quickly and within an address-space limit (``resource.setrlimit`` in a subprocess), never by allocating what the
file declares.

The limit is derived from what the interpreter needs: the child imports gradstat's command line and asks torch
for a CUDA device (a CUDA build of torch maps several GiB of libraries; the CPU build under 1 GiB), reads its
peak address space (``VmPeak``) and allows :data:`ALLOWANCE` more. That is far below what the forged sizes would
need (10^12 elements, 10^9 workers, a 4 GiB member; a test below checks that the smallest is refused) and far
above what gradstat itself needs; a reader that allocated first would fail with an allocation error (a traceback,
not exit 2). All the
cases run in one limited subprocess (one interpreter start-up for the whole suite), each command's stderr captured
separately. The elapsed time of each command is bounded by 10 s only to catch hangs (the 82 s ``workers: 10^9``
case); it is no performance claim.
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _dumpkit import write_dump

from gradstat.analysis.dumps import open_dump
from gradstat.analysis.dumps.convert import export_npz, import_dump
from gradstat.analysis.dumps.format import sha256_file

pytest.importorskip("resource", reason="address-space limits need the POSIX resource module")
if not Path("/proc/self/status").is_file():
    pytest.skip("the address-space baseline is read from /proc/self/status (Linux)", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[2]
ALLOWANCE = 512 << 20
"""Address space allowed above the interpreter's own peak once gradstat and torch are loaded (512 MiB)."""
SMALLEST_FORGED = 4_294_967_294
"""The smallest size a hostile case declares (bytes): the npz member's forged uncompressed size."""
LIMIT_SETUP = """
import re, resource
from gradstat.analysis.cli.main import main
import torch
torch.cuda.is_available()  # a CUDA build maps its libraries (and the driver its reservations) before the limit
with open("/proc/self/status") as status:
    peak = int(re.search(r"VmPeak:\\s+(\\d+) kB", status.read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (peak + {allowance}, peak + {allowance}))
"""
RUNNER = """
import contextlib, io, json, sys, time
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        crash = None
    except BaseException as exc:  # an allocation failure or a traceback: reported, the next case still runs
        code, crash = None, f"{{type(exc).__name__}}: {{str(exc)[:300]}}"
    results.append({{"code": code, "stderr": err.getvalue(), "seconds": time.perf_counter() - start, "crash": crash}})
print(json.dumps(results))
"""


def run_limited(commands: list[list[str]], runner: str = RUNNER) -> list[dict]:
    """Run gradstat commands one after the other in a subprocess limited to its own peak address space after
    loading gradstat plus :data:`ALLOWANCE`; ``runner``: the code run under the limit (``sys.argv[1]``: the
    commands as JSON, its last output line: a JSON list)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", (LIMIT_SETUP + runner).format(allowance=ALLOWANCE), json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CASES: dict[str, tuple[object, str]] = {}
"""name -> (setup(tmp) returning the argv lists to run, regex the last command's error line must match)."""


def case(pattern: str):
    def register(setup):
        CASES[setup.__name__] = (setup, pattern)
        return setup

    return register


SOUND = "a sound dump"
"""The key of :func:`outcomes`' last entry: ``gradstat info`` on a sound dump, after every hostile case."""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[dict]]:
    """Set up every case in its own directory, run all their commands in one limited subprocess, then ``info`` on a
    sound dump (key :data:`SOUND`) in the same subprocess."""
    commands, owners = [], []
    for name, (setup, _) in CASES.items():
        for argv in setup(tmp_path_factory.mktemp(name)):
            commands.append(argv)
            owners.append(name)
    commands.append(["info", str(small_dump(tmp_path_factory.mktemp("sound")))])
    owners.append(SOUND)
    results = run_limited(commands)
    grouped: dict[str, list[dict]] = {}
    for name, result in zip(owners, results, strict=True):
        grouped.setdefault(name, []).append(result)
    return grouped


def edit_manifest(path: Path, change) -> None:
    m = json.loads((path / "manifest.json").read_text())
    change(m)
    (path / "manifest.json").write_text(json.dumps(m))


def rewrite_header(dump: Path, step: int, change) -> None:
    """Change step ``step``'s safetensors header with ``change(header)`` and record the new size and checksum in
    the manifest, so that only the header itself is wrong."""
    file = dump / f"step-{step:08d}.safetensors"
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])

    def fix(m):
        entry = next(e for e in m["steps"] if e["step"] == step)
        entry["bytes"], entry["sha256"] = file.stat().st_size, sha256_file(file)

    edit_manifest(dump, fix)


def npy_claiming(path: Path, count: int) -> Path:
    """An .npy file whose header claims ``count`` float32 values followed by 16 bytes of data."""
    header = {"descr": "<f4", "fortran_order": False, "shape": (count,)}
    text = repr(header).encode()
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + b"\x00" * 16)
    return path


def small_dump(tmp: Path) -> Path:
    path = tmp / "dump"
    write_dump(path, steps=(0, 5))
    return path


# ---- declared sizes --------------------------------------------------------------------------------------------
@case(r"manifest\.json: declares .* bytes of data per step\), more than step file")
def manifest_declaring_a_huge_shape(tmp):
    dump = small_dump(tmp)
    edit_manifest(dump, lambda m: m["params"][0].update(shape=[100_000, 1_000_000]))
    return [["info", str(dump)]]


@case(r"tensor 'w0/layer.weight' has shape \(100000, 1000000\)")
def header_declaring_a_huge_shape(tmp):
    dump = small_dump(tmp)
    rewrite_header(
        dump, 0, lambda h: h["w0/layer.weight"].update(shape=[100_000, 1_000_000], data_offsets=[0, 4 * 10**11])
    )
    return [["info", str(dump)]]


@case(r"more than step file")
def manifest_and_header_declaring_a_huge_shape(tmp):
    dump = small_dump(tmp)
    rewrite_header(
        dump, 0, lambda h: h["w0/layer.weight"].update(shape=[100_000, 1_000_000], data_offsets=[0, 4 * 10**11])
    )
    edit_manifest(dump, lambda m: m["params"][0].update(shape=[100_000, 1_000_000]))
    return [["info", str(dump)]]


@case(r"declares 1,000,000,000 workers")
def a_billion_workers(tmp):
    dump = small_dump(tmp)
    edit_manifest(dump, lambda m: m.update(workers=10**9))
    return [["info", str(dump)]]


@case(r"manifest\.json: JSON nested too deeply")
def manifest_nested_200k_levels(tmp):
    dump = small_dump(tmp)
    (dump / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    return [["info", str(dump)]]


@case(r"step-00000000\.safetensors: corrupt safetensors header")
def header_nested_50k_levels(tmp):
    dump = small_dump(tmp)
    file = dump / "step-00000000.safetensors"
    body = b"[" * 50_000 + b"]" * 50_000
    file.write_bytes(struct.pack("<Q", len(body)) + body)
    edit_manifest(dump, lambda m: m["steps"][0].update(bytes=file.stat().st_size, sha256=sha256_file(file)))
    return [["info", str(dump)]]


@case(r"g\.npy: unreadable \.npy, a header declaring shape \(1000000000000,\)")
def npy_header_claiming_10_to_12_elements(tmp):
    return [["import", str(npy_claiming(tmp / "g.npy", 10**12)), "--out", str(tmp / "d")]]


@case(r"g\.npz: unreadable \.npz, member 'w\.npy' is a header declaring shape \(1000000000000,\)")
def npz_member_claiming_10_to_12_elements(tmp):
    member = npy_claiming(tmp / "w.npy", 10**12).read_bytes()
    with zipfile.ZipFile(tmp / "g.npz", "w") as z:
        z.writestr("w.npy", member)
    return [["import", str(tmp / "g.npz"), "--out", str(tmp / "d")]]


@case(r"g\.npz: unreadable \.npz, member 'w\.npy' is declared as 4,294,967,294 bytes")
def npz_member_forging_its_uncompressed_size(tmp):
    src = tmp / "g.npz"
    np.savez_compressed(src, w=np.ones(1000, dtype=np.float32))
    raw = bytearray(src.read_bytes())
    central = raw.rfind(b"PK\x01\x02")  # central directory record: uncompressed size at offset 24
    raw[central + 24 : central + 28] = struct.pack("<I", 0xFFFFFFFE)
    src.write_bytes(bytes(raw))
    return [["import", str(src), "--out", str(tmp / "d")]]


# ---- checksums, versions, steps ---------------------------------------------------------------------------------
@case(r"the checksum field 'sha256/w0/layer\.weight' of tensor 'w0/layer\.weight' is missing from the header$")
def header_checksum_key_renamed(tmp):
    dump = small_dump(tmp)

    def rename(h):
        meta = h["__metadata__"]
        meta["sha257/w0/layer.weight"] = meta.pop("sha256/w0/layer.weight")

    rewrite_header(dump, 0, rename)
    return [["info", str(dump)]]


@case(r"the checksum field 'sha256/w0/layer\.weight' must be 'sha256:' and 64 hex digits, got 'sha512:")
def header_checksum_prefix_renamed(tmp):
    dump = small_dump(tmp)

    def rename(h):
        meta = h["__metadata__"]
        meta["sha256/w0/layer.weight"] = meta["sha256/w0/layer.weight"].replace("sha256:", "sha512:")

    rewrite_header(dump, 0, rename)
    return [["info", str(dump)]]


@case(r"step 0: the checksum field 'sha256' is missing")
def manifest_checksum_key_renamed(tmp):
    dump = small_dump(tmp)
    edit_manifest(dump, lambda m: m["steps"][0].update(sha512=m["steps"][0].pop("sha256")))
    return [["info", str(dump)]]


@case(r"'format_version' must be an integer >= 1, got True")
def format_version_true(tmp):
    dump = small_dump(tmp)
    edit_manifest(dump, lambda m: m.update(format_version=True))
    return [["info", str(dump)]]


@case(r"'format_version' must be an integer >= 1, got 1\.0")
def format_version_float(tmp):
    dump = small_dump(tmp)
    edit_manifest(dump, lambda m: m.update(format_version=1.0))
    return [["info", str(dump)]]


@case(r"field 'workers' must be of type int, got True")
def workers_true(tmp):
    dump = small_dump(tmp)
    edit_manifest(dump, lambda m: m.update(workers=True))
    return [["info", str(dump)]]


@case(r"step numbers must be integers >= 0, got -1$")
def negative_step(tmp):
    dump = small_dump(tmp)
    edit_manifest(dump, lambda m: m["steps"][0].update(step=-1))
    return [["info", str(dump)]]


# ---- files that are not what they claim ------------------------------------------------------------------------
@case(r"step-00000005\.safetensors: a symbolic link to .*elsewhere\.safetensors, outside the dump")
def step_file_symlinked_outside_the_dump(tmp):
    dump = small_dump(tmp)
    outside, step = tmp / "elsewhere.safetensors", dump / "step-00000005.safetensors"
    outside.write_bytes(step.read_bytes())
    step.unlink()
    step.symlink_to(outside)
    return [["info", str(dump)]]


@case(r"tensors 'w0/layer\.(bias|weight)' and 'w0/layer\.(bias|weight)' overlap in the file")
def overlapping_tensor_offsets(tmp):
    dump = small_dump(tmp)

    def overlap(h):
        begin = h["w0/layer.weight"]["data_offsets"][0]
        h["w0/layer.bias"]["data_offsets"] = [begin, begin + 16]

    rewrite_header(dump, 0, overlap)
    return [["info", str(dump)]]


@case(r"an unfinished dump \(an interrupted write left only \.manifest\.json\.4242\.tmp, no committed step\)")
def directory_holding_only_a_leftover_manifest_tmp(tmp):
    (tmp / "d").mkdir()
    (tmp / "d" / ".manifest.json.4242.tmp").write_text("{partial")
    return [["info", str(tmp / "d")]]


@case(r"directory is not empty and is not a gradstat dump")
def leftover_beside_a_users_file(tmp):
    (tmp / "d").mkdir()
    (tmp / "d" / ".manifest.json.4242.tmp").write_text("{partial")
    (tmp / "d" / "notes.txt").write_text("mine")
    np.save(tmp / "g.npy", np.ones(3, dtype=np.float32))
    return [["import", str(tmp / "g.npy"), "--out", str(tmp / "d")]]


@case(r"out\.npz: cannot write \(No such file or directory\); out\.npz was left as it was")
def export_into_a_missing_directory(tmp):
    dump = small_dump(tmp)
    return [["export", str(dump), "--out", str(tmp / "missing-dir" / "out.npz")]]


@pytest.mark.parametrize("name", list(CASES))  # filled by the @case definitions below (module import order)
def test_hostile_input_is_refused_with_a_one_line_error(outcomes, name):
    result = outcomes[name][-1]
    assert result["crash"] is None, result["crash"]
    lines = result["stderr"].strip().splitlines()
    assert result["code"] == 2 and len(lines) == 1 and lines[0].startswith("gradstat: error: "), result
    assert re.search(CASES[name][1], lines[0]), lines[0]
    assert ".tmp'" not in lines[0] and "Traceback" not in result["stderr"]
    assert result["seconds"] < 10.0


def test_a_dump_can_be_written_over_an_interrupted_write(tmp_path):
    """A directory holding only an interrupted write's temporary file is an unfinished dump: writing there removes
    the leftover and succeeds."""
    d = tmp_path / "d"
    d.mkdir()
    (d / ".manifest.json.4242.tmp").write_text("{partial")
    np.save(tmp_path / "g.npy", np.ones(3, dtype=np.float32))
    import_dump(tmp_path / "g.npy", d)
    assert not (d / ".manifest.json.4242.tmp").exists() and open_dump(d).steps == [0]


def test_no_space_left_names_the_file(tmp_path, monkeypatch):
    import gradstat.analysis.dumps.atomic as atomic

    dump = small_dump(tmp_path)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    target = tmp_path / "out.npz"
    with pytest.raises(OSError, match=r"out\.npz: cannot write \(No space left on device\)") as info:
        export_npz(open_dump(dump), target)
    assert info.value.errno == errno.ENOSPC and ".tmp" not in str(info.value)
    assert not target.exists() and not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


def test_a_sound_dump_still_reads_under_the_same_limit(outcomes):
    """In the same limited subprocess, after every hostile case (no second interpreter start-up)."""
    (result,) = outcomes[SOUND]
    assert result["code"] == 0 and result["crash"] is None, result


def test_the_limit_refuses_an_allocation_of_the_smallest_forged_size():
    """The limit has teeth: allocating what the smallest hostile case declares fails under it."""
    runner = f"""
import json
try:
    bytearray({SMALLEST_FORGED})
    print(json.dumps(["allocated"]))
except MemoryError:
    print(json.dumps(["refused"]))
"""
    assert run_limited([], runner) == ["refused"]
