"""The gradient dump format: names, manifest schema and its validation (specification: ``data/README.md``).

A dump is a directory holding ``manifest.json`` and one safetensors file per recorded step
(``step-00000005.safetensors``). Tensor keys are ``w{worker}/{param}`` for gradients and
``x/{extra}/w{worker}/{param}`` for extra tensors (e.g. the error-feedback residual). Each step file's header
metadata carries the sha256 of every tensor's bytes (checked when that tensor is read); the manifest carries the
sha256 and size of every whole file (checked by :meth:`gradstat.analysis.dumps.reader.Dump.verify`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import torch

FORMAT = "gradstat-dump"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TMP_SUFFIX = ".tmp"
STEP_FILE = re.compile(r"^step-(\d{8,})\.safetensors$")
CHECKSUM_PREFIX = "sha256:"
CHECKSUM = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_MANIFEST_BYTES = 64 << 20
"""A manifest larger than this is refused before it is parsed (real ones are a few kB per thousand steps)."""
LEFTOVER = re.compile(
    r"^\.(?:(?:manifest\.json|step-\d{8,}\.safetensors)\.\d+\.tmp|\.?step-\d{8,}\.rank-\d+\.part\.tmp(?:\.\d+\.tmp)?)$"
)
"""Temporary files of an interrupted atomic write (:mod:`gradstat.analysis.dumps.atomic`) and the ranks' part files
of a step never committed (:func:`gradstat.analysis.dumps.writer.write_rank_part`, and their own temporaries)."""

STORAGE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
RECORDED_DEVICE_KEY = "device"
"""The manifest ``metadata`` key holding the device type ("cpu", "cuda") the recorded gradients were computed on."""
SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


class DumpError(ValueError):
    """A dump is missing, malformed, corrupt, or the request does not fit it. The message names the file."""


def step_file(step: int) -> str:
    """File name of a recorded step."""
    return f"step-{step:08d}.safetensors"


def grad_key(worker: int, param: str) -> str:
    """Key of a worker's gradient of one parameter inside a step file."""
    return f"w{worker}/{param}"


def extra_key(extra: str, worker: int, param: str) -> str:
    """Key of an extra tensor (e.g. ``residual``) of one worker and parameter inside a step file."""
    return f"x/{extra}/w{worker}/{param}"


def checksum_key(key: str) -> str:
    """Header-metadata key holding the sha256 of tensor ``key``'s bytes."""
    return f"sha256/{key}"


def storage_dtype(name: str) -> torch.dtype:
    """The torch dtype of a storage dtype name (``float32``, ``float16``, ``bfloat16``)."""
    if name not in STORAGE_DTYPES:
        raise ValueError(f"dtype {name!r} is not a storage dtype; accepted: {', '.join(STORAGE_DTYPES)}")
    return STORAGE_DTYPES[name]


def sha256_bytes(data: bytes | memoryview) -> str:
    return CHECKSUM_PREFIX + hashlib.sha256(data).hexdigest()


def sha256_tensor(t: torch.Tensor) -> str:
    """sha256 of a CPU tensor's raw little-endian bytes, as stored in a step file."""
    data = t.contiguous().view(-1).view(torch.uint8).numpy()
    return sha256_bytes(memoryview(data))  # type: ignore[arg-type]  # numpy's stubs: ndarray is a buffer only on Python >= 3.12


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return CHECKSUM_PREFIX + h.hexdigest()


def leftovers(path: Path) -> list[Path]:
    """Temporary files an interrupted write left in the dump directory ``path`` (safe to delete)."""
    return sorted(f for f in path.iterdir() if LEFTOVER.match(f.name) and f.is_file() and not f.is_symlink())


def is_unfinished(path: Path) -> bool:
    """True when ``path`` is a directory holding only temporary files of an interrupted write (no manifest yet)."""
    found = leftovers(path)
    return bool(found) and len(found) == sum(1 for _ in path.iterdir())


def load_json(file: Path, what: str, limit: int | None = None) -> Any:
    """Parse a JSON file, refusing sizes above ``limit`` and nesting Python cannot parse, as :class:`DumpError`."""
    size = file.stat().st_size
    if limit is not None and size > limit:
        raise DumpError(f"{file}: {size:,} bytes, larger than any {what} ({limit:,} bytes at most); refusing to parse")
    try:
        return json.loads(file.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DumpError(f"{file}: not valid JSON ({exc})") from None
    except RecursionError:
        raise DumpError(f"{file}: JSON nested too deeply to be a {what}") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """Load and validate ``path/manifest.json``; raise :class:`DumpError` naming the file and the problem."""
    file = path / MANIFEST
    if not path.is_dir():
        raise DumpError(f"{path}: not a directory (a gradient dump is a directory holding {MANIFEST})")
    if not file.is_file():
        if is_unfinished(path):
            names = ", ".join(f.name for f in leftovers(path))
            raise DumpError(
                f"{path}: an unfinished dump (an interrupted write left only {names}, no committed step); delete "
                "the directory, or write a new dump into it (the leftovers are removed then)"
            )
        raise DumpError(f"{file}: missing; {path} is not a gradstat dump")
    manifest = load_json(file, "gradstat manifest", MAX_MANIFEST_BYTES)
    validate_manifest(manifest, file)
    return manifest


def is_int(value: Any) -> bool:
    """A JSON integer (``true``/``false`` are not integers here, although Python's bool is an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _require(cond: bool, file: Path, problem: str) -> None:
    if not cond:
        raise DumpError(f"{file}: {problem}")


def validate_manifest(m: Any, file: Path) -> None:
    """Check the manifest's schema and internal consistency (not the step files)."""
    _require(isinstance(m, dict), file, "the manifest must be a JSON object")
    _require(m.get("format") == FORMAT, file, f"'format' is {m.get('format')!r}, expected {FORMAT!r}")
    version = m.get("format_version")
    _require(is_int(version) and version >= 1, file, f"'format_version' must be an integer >= 1, got {version!r}")
    if version > FORMAT_VERSION:
        raise DumpError(
            f"{file}: written by dump format version {version}, this gradstat reads versions up to "
            f"{FORMAT_VERSION}; upgrade gradstat to read it"
        )
    for key, kind in (
        ("workload", str),
        ("dtype", str),
        ("workers", int),
        ("every", int),
        ("params", list),
        ("extras", list),
        ("steps", list),
        ("optimizer", dict),
        ("seeds", dict),
        ("metadata", dict),
        ("versions", dict),
    ):
        ok = is_int(m.get(key)) if kind is int else isinstance(m.get(key), kind)
        _require(ok, file, f"field {key!r} must be of type {kind.__name__}, got {_short(m.get(key))}")
    _require(m["dtype"] in STORAGE_DTYPES, file, f"dtype {m['dtype']!r} is not one of {', '.join(STORAGE_DTYPES)}")
    _require(m["workers"] >= 1, file, f"workers must be >= 1, got {m['workers']}")
    _require(m["every"] >= 1, file, f"every must be >= 1, got {m['every']}")
    _require(len(m["params"]) >= 1, file, "no parameters listed")
    names = set()
    for p in m["params"]:
        ok = (
            isinstance(p, dict)
            and isinstance(p.get("name"), str)
            and p["name"]
            and isinstance(p.get("shape"), list)
            and all(is_int(s) and s >= 0 for s in p["shape"])
        )
        _require(
            bool(ok), file, f"parameter entry {_short(p)} needs a non-empty 'name' and a 'shape' list of integers >= 0"
        )
        _require(p["name"] not in names, file, f"parameter {p['name']!r} listed twice")
        _require(
            p.get("dtype", m["dtype"]) == m["dtype"],
            file,
            f"parameter {p['name']!r} has dtype {p.get('dtype')!r}, the dump stores {m['dtype']!r}",
        )
        names.add(p["name"])
    _require(
        all(isinstance(e, str) and e and "/" not in e for e in m["extras"]),
        file,
        f"extras must be names without '/', got {m['extras']!r}",
    )
    last = -1
    for entry in m["steps"]:
        ok = (
            isinstance(entry, dict)
            and is_int(entry.get("step"))
            and isinstance(entry.get("file"), str)
            and is_int(entry.get("bytes"))
        )
        _require(bool(ok), file, f"step entry {_short(entry)} needs integer 'step' and 'bytes' and a string 'file'")
        _require(
            isinstance(entry.get("sha256"), str),
            file,
            f"step {entry['step']}: the checksum field 'sha256' is missing (keys: {sorted(entry)})",
        )
        _require(
            bool(CHECKSUM.match(entry["sha256"])),
            file,
            f"step {entry['step']}: the checksum field 'sha256' must be 'sha256:' and 64 hex digits, "
            f"got {_short(entry['sha256'])}",
        )
        _require(entry["step"] >= 0, file, f"step numbers must be integers >= 0, got {entry['step']}")
        _require(entry["bytes"] >= 0, file, f"step {entry['step']}: 'bytes' must be >= 0, got {entry['bytes']}")
        _require(entry["step"] > last, file, f"steps must be strictly increasing, got {entry['step']} after {last}")
        _require(
            entry["file"] == step_file(entry["step"]),
            file,
            f"step {entry['step']} must be stored in {step_file(entry['step'])}, manifest says {entry['file']!r}",
        )
        last = entry["step"]


def _short(value: Any, limit: int = 120) -> str:
    """repr cut to ``limit`` characters (hostile manifests can hold huge values)."""
    try:
        text = repr(value) if not isinstance(value, (dict, list)) or len(value) < 1000 else f"<{type(value).__name__}>"
    except RecursionError:
        text = f"<deeply nested {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def numel(shape: list[int] | tuple[int, ...]) -> int:
    return math.prod(shape)
