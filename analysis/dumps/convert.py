"""Import foreign gradient files into a dump, and export dump steps to ``.npz``.

Import sources (nothing is ever unpickled: ``.pt`` files are read with ``torch.load(weights_only=True)``,
``.npz``/``.npy`` with ``allow_pickle=False``):

- ``.pt``: one step is a dict ``{param: tensor}`` (one worker), a list of such dicts (one per worker), or a dict
  ``{rank: {param: tensor}}`` with ranks 0..P-1 (ints or digit strings); the file holds one step in any of these
  forms, or a list of steps (a list of dicts is one step per dict, as before; a list of lists or of rank dicts is
  one step per item, each with its workers), or ``{step: [per-worker dicts]}`` (step numbers kept);
- ``.npz``: ``{param: array}`` (one step), ``w{worker}/{param}`` (one step, several workers), or the export layout
  ``s{step}/w{worker}/{param}`` (steps and workers restored);
- ``.npy``: one array, one step, parameter ``grad``;
- a directory of such files: taken in natural name order, steps numbered consecutively.

Every ``.npy`` header (alone or inside an ``.npz``) is checked against the bytes that hold it before anything is
allocated, so a header claiming 10^12 elements is refused at once. Imported dumps have workload ``imported`` unless
told otherwise. The layouts are documented in ``data/README.md``.
"""

from __future__ import annotations

import contextlib
import io
import math
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import IO, Iterator, Sequence

import numpy as np
import torch

from gradstat.analysis.dumps.atomic import write_atomic
from gradstat.analysis.dumps.format import DumpError
from gradstat.analysis.dumps.reader import Dump
from gradstat.analysis.dumps.writer import DumpWriter, check_new_dump_dir

SUFFIXES = (".pt", ".pth", ".npz", ".npy")
EXPORT_KEY = re.compile(r"^s(\d+)/w(\d+)/(.+)$")
WORKER_KEY = re.compile(r"^w(\d+)/(.+)$")
DEFLATE_MAX_RATIO = 1100
"""Deflate expands at most about 1032:1; a zip member declaring more is forged (checked before decompressing)."""
Step = tuple[int | None, list[dict[str, torch.Tensor]]]  # (step number if the file names it, per-worker dicts)


def import_dump(src: str | Path, out: str | Path, workload: str = "imported", dtype: str = "float32") -> Path:
    """Convert ``src`` (file or directory, see module doc) into a new dump at ``out``; returns ``out``.

    Raises
    ------
    DumpError / ValueError / OSError
        unreadable or unsafe input (naming the file), inconsistent parameters between steps, an unusable ``out``,
        a failed write (naming the file). On any error nothing is left at ``out``: what this import wrote is
        removed (``out`` itself too unless it existed, empty, before), so no partial dump passes for a whole one.
    """
    src, out = Path(src), Path(out)
    if not src.exists():
        raise DumpError(f"{src}: no such file or directory")
    check_new_dump_dir(out)  # missing or empty from here on: whatever is in it later, this import wrote
    existed = out.exists()
    try:
        return _convert(src, out, workload, dtype)
    except DumpError as exc:
        if _remove_written(out, existed):
            raise DumpError(f"{exc}; nothing was imported (the partial dump at {out} was removed)") from None
        raise
    except BaseException:
        _remove_written(out, existed)
        raise


def _remove_written(out: Path, existed: bool) -> bool:
    """Remove what an import wrote at ``out`` (a dump directory that was missing or empty before it, see
    :func:`~gradstat.analysis.dumps.writer.check_new_dump_dir`); True when something was removed."""
    if not out.is_dir() or out.is_symlink():
        return False
    found = list(out.iterdir())
    for f in found:
        if f.is_dir() and not f.is_symlink():
            shutil.rmtree(f, ignore_errors=True)
        else:
            f.unlink(missing_ok=True)
    if not existed:
        with contextlib.suppress(OSError):
            out.rmdir()
    return bool(found) or not existed


def _convert(src: Path, out: Path, workload: str, dtype: str) -> Path:
    """The import itself (see :func:`import_dump`)."""
    writer: DumpWriter | None = None
    next_step = 0
    for file, (step, workers) in _steps(src):
        step = next_step if step is None else step
        if writer is None:
            first = workers[0]
            params = [(n, tuple(t.shape)) for n, t in first.items()]
            writer = DumpWriter(
                out,
                workload=workload,
                params=params,
                workers=len(workers),
                dtype=dtype,
                metadata={"imported_from": str(src)},
            )
        try:
            writer.write_step(step, workers)
        except (ValueError, TypeError) as exc:
            raise DumpError(f"{file}: {exc}") from None
        next_step = step + 1
    if writer is None:
        raise DumpError(f"{src}: no {'/'.join(SUFFIXES)} files to import")
    return out


def export_npz(
    dump: Dump,
    out: str | Path,
    steps: Sequence[int] | None = None,
    workers: Sequence[int] | None = None,
    extras: bool = False,
) -> Path:
    """Write ``steps`` (default: all) of ``workers`` (default: all) to ``out`` as ``.npz`` with keys
    ``s{step}/w{worker}/{param}`` (and ``x/{extra}/s{step}/w{worker}/{param}`` with ``extras``), float32.
    Everything is read (and validated) before ``out`` is written; an existing ``out`` is never overwritten."""
    out = Path(out)
    if out.suffix != ".npz":
        raise ValueError(f"export target {out} must end in .npz")
    if out.exists():
        raise DumpError(f"{out}: exists; refusing to overwrite it (choose another --out)")
    steps = dump.steps if steps is None else list(steps)
    workers = range(dump.workers) if workers is None else list(workers)
    arrays: dict[str, np.ndarray] = {}
    for s in steps:
        for w in workers:
            for name, t in dump.read(s, w, dtype=torch.float32).items():
                arrays[f"s{s}/w{w}/{name}"] = t.numpy()
            for e in dump.extras if extras else []:
                for name, t in dump.read_extra(e, s, w, dtype=torch.float32).items():
                    arrays[f"x/{e}/s{s}/w{w}/{name}"] = t.numpy()
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub lets **kwds collide with allow_pickle: bool
    write_atomic(out, buf.getbuffer())
    return out


# -- readers ------------------------------------------------------------------------------------------------
def _natural(path: Path) -> list:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", path.name)]


def _steps(src: Path) -> Iterator[tuple[Path, Step]]:
    files = (
        sorted((f for f in src.iterdir() if f.suffix in SUFFIXES and f.is_file()), key=_natural)
        if src.is_dir()
        else [src]
    )
    for file in files:
        if file.suffix not in SUFFIXES:
            raise DumpError(
                f"{file}: cannot import a {file.suffix or 'suffix-less'} file; accepted: {', '.join(SUFFIXES)}"
            )
        reader = {".pt": _read_pt, ".pth": _read_pt, ".npz": _read_npz, ".npy": _read_npy}[file.suffix]
        for step in reader(file):
            yield file, step


def _tensor(value: object, file: Path, where: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise DumpError(
            f"{file}: {where} is {type(value).__name__}"
            f"{' of dtype ' + str(t.dtype) if isinstance(t, torch.Tensor) else ''}; "
            f"a gradient must be a floating-point tensor"
        )
    return t


def _named(obj: object, file: Path, where: str) -> dict[str, torch.Tensor]:
    if not isinstance(obj, dict) or not obj or not all(isinstance(k, str) for k in obj):
        raise DumpError(
            f"{file}: {where} must be a non-empty dict of parameter name -> tensor, got {type(obj).__name__}"
        )
    return {k: _tensor(v, file, f"{where}[{k!r}]") for k, v in obj.items()}


def _workers(obj: object, file: Path, where: str) -> list[dict[str, torch.Tensor]] | None:
    """The per-worker dicts of one step written as a list of dicts or a ``{rank: dict}`` dict; None when ``obj`` is
    a single worker's ``{param: tensor}`` dict (or not a multi-worker layout at all)."""
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(item, dict) for item in obj):
        return [_named(item, file, f"{where} worker {w}") for w, item in enumerate(obj)]
    if isinstance(obj, dict) and obj and all(isinstance(v, dict) for v in obj.values()):
        ranks = {}
        for key in obj:
            rank = key if isinstance(key, int) and not isinstance(key, bool) else None
            if isinstance(key, str) and key.isdigit():
                rank = int(key)
            if rank is None:
                raise DumpError(
                    f"{file}: {where} is a dict of dicts whose key {key!r} is not a worker rank; expected "
                    "{rank: {param: tensor}} with ranks 0..P-1"
                )
            ranks[rank] = obj[key]
        if sorted(ranks) != list(range(len(ranks))):
            raise DumpError(f"{file}: {where} holds worker ranks {sorted(ranks)}, expected 0..{len(ranks) - 1}")
        return [_named(ranks[w], file, f"{where} worker {w}") for w in range(len(ranks))]
    return None


def _read_pt(file: Path) -> Iterator[Step]:
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DumpError(
            f"{file}: refused, not a plain dict or list of tensors (read with weights_only=True, "
            f"nothing is unpickled): {first}"
        ) from None
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise DumpError(f"{file}: empty list, nothing to import")
        if all(isinstance(item, dict) and not _is_rank_dict(item) for item in obj):
            for i, item in enumerate(obj):  # a list of {param: tensor}: one step each (one worker)
                yield None, [_named(item, file, f"item {i}")]
            return
        for i, item in enumerate(obj):
            workers = _workers(item, file, f"step item {i}")
            if workers is None:
                raise DumpError(
                    f"{file}: step item {i} is {type(item).__name__}; each item of a list of steps must be a "
                    "list of per-worker dicts or a {rank: {param: tensor}} dict"
                )
            yield None, workers
        return
    if isinstance(obj, dict) and obj and all(isinstance(v, (list, tuple)) for v in obj.values()):
        yield from _step_dict(obj, file)  # {step: [per-worker dicts]}: step numbers kept
        return
    workers = _workers(obj, file, "the top-level object") if _is_rank_dict(obj) else None
    yield None, workers if workers is not None else [_named(obj, file, "the top-level object")]


def _step_dict(obj: dict, file: Path) -> Iterator[Step]:
    steps = {}
    for key, value in obj.items():
        step = int(key) if isinstance(key, str) and key.isdigit() else key
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise DumpError(f"{file}: key {key!r} of a {{step: [per-worker dicts]}} dict is not a step number >= 0")
        steps[step] = value
    for step in sorted(steps):
        workers = _workers(steps[step], file, f"step {step}")
        if workers is None:
            raise DumpError(f"{file}: step {step} must be a non-empty list of per-worker {{param: tensor}} dicts")
        yield step, workers


def _is_rank_dict(obj: object) -> bool:
    """A dict whose values are all dicts: ``{rank: {param: tensor}}`` (ranks are checked by :func:`_workers`)."""
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, dict) for v in obj.values())


def _check_npy_header(fp: IO[bytes], available: int, where: str) -> None:
    """Read an .npy header from ``fp`` and refuse it unless its data fits in the ``available`` bytes that hold
    the header and the data (before numpy allocates the declared shape). ``where`` starts the error message."""
    try:
        version = np.lib.format.read_magic(fp)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fp)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise DumpError(f"{where} not a valid .npy header ({exc})") from None
    if dtype.hasobject:
        raise DumpError(f"{where} an object array; object arrays are refused (no unpickling)")
    declared = math.prod(shape) * dtype.itemsize
    left = available - fp.tell()
    if declared > left:
        raise DumpError(
            f"{where} a header declaring shape {tuple(shape)} of {dtype} ({declared:,} bytes) but only "
            f"{max(left, 0):,} bytes follow (truncated or forged)"
        )


def _check_npz(file: Path) -> None:
    """Check every member of an .npz before numpy reads it: plausible sizes and an .npy header that fits."""
    try:
        with zipfile.ZipFile(file) as archive:
            for info in archive.infolist():
                where = f"{file}: unreadable .npz, member {info.filename!r} is"
                limit = info.compress_size * (DEFLATE_MAX_RATIO if info.compress_type else 1) + 1024
                if info.file_size > limit:
                    raise DumpError(
                        f"{where} declared as {info.file_size:,} bytes from {info.compress_size:,} compressed (forged)"
                    )
                with archive.open(info) as fp:
                    _check_npy_header(fp, info.file_size, where)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as exc:
        raise DumpError(f"{file}: unreadable .npz ({exc})") from None


def _read_npz(file: Path) -> Iterator[Step]:
    _check_npz(file)
    try:
        with np.load(file, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DumpError(f"{file}: unreadable .npz ({exc}); object arrays are refused (no unpickling)") from None
    if not arrays:
        raise DumpError(f"{file}: holds no arrays")
    matches = {k: m for k in arrays if (m := EXPORT_KEY.match(k)) is not None}
    if len(matches) != len(arrays):
        per_worker = {k: m for k in arrays if (m := WORKER_KEY.match(k)) is not None}
        if len(per_worker) == len(arrays):  # w{worker}/{param}: one step, several workers
            ranks: dict[int, dict[str, np.ndarray]] = {}
            for key, m in per_worker.items():
                ranks.setdefault(int(m.group(1)), {})[m.group(2)] = arrays[key]
            if sorted(ranks) != list(range(len(ranks))):
                raise DumpError(f"{file}: holds workers {sorted(ranks)}, expected 0..{len(ranks) - 1}")
            yield None, [_named(ranks[w], file, f"worker {w}") for w in range(len(ranks))]
            return
        yield None, [_named(arrays, file, "the archive")]
        return
    table: dict[int, dict[int, dict[str, np.ndarray]]] = {}
    for key, m in matches.items():
        table.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), {})[m.group(3)] = arrays[key]
    for step in sorted(table):
        ws = table[step]
        if sorted(ws) != list(range(len(ws))):
            raise DumpError(f"{file}: step {step} holds workers {sorted(ws)}, expected 0..{len(ws) - 1}")
        yield step, [_named(ws[w], file, f"step {step} worker {w}") for w in sorted(ws)]


def _read_npy(file: Path) -> Iterator[Step]:
    try:
        with open(file, "rb") as fp:
            _check_npy_header(fp, file.stat().st_size, f"{file}: unreadable .npy,")
    except OSError as exc:
        raise DumpError(f"{file}: unreadable .npy ({exc})") from None
    try:
        array = np.load(file, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DumpError(f"{file}: unreadable .npy ({exc}); object arrays are refused (no unpickling)") from None
    yield None, [{"grad": _tensor(array, file, "the array")}]
