"""Writing gradient dumps: :class:`DumpWriter` creates a dump or appends to one, one step file per call.

Multi-rank writing (distributed training, one process per worker): each rank writes its own gradients of a step
with :func:`write_rank_part` into a hidden part file of the dump directory (atomically, under a name ending in the
temporary suffix, so readers ignore it and :meth:`DumpWriter.append` removes leftovers); once every rank has
written (the caller synchronises, e.g. ``torch.distributed.barrier``), rank 0 calls
:meth:`DumpWriter.commit_rank_parts`, which assembles the parts into the ordinary step file, commits the manifest
atomically as for any step, and removes the parts. The dump format is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import json
import platform
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import safetensors
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_bytes

from gradstat.analysis.dumps.atomic import write_atomic
from gradstat.analysis.dumps.format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    STEP_FILE,
    TMP_SUFFIX,
    DumpError,
    checksum_key,
    extra_key,
    grad_key,
    is_unfinished,
    leftovers,
    read_manifest,
    sha256_bytes,
    sha256_tensor,
    step_file,
    storage_dtype,
)

WorkerTensors = Sequence[Mapping[str, torch.Tensor]]


def library_versions() -> dict[str, str]:
    """Versions of the libraries that produced a dump (recorded in its manifest)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        gradstat = version("gradstat")
    except PackageNotFoundError:
        gradstat = "unknown"
    return {
        "gradstat": gradstat,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
    }


class DumpWriter:
    """Create a new dump at ``path`` (a missing or empty directory) and write steps into it.

    Parameters
    ----------
    path : directory of the dump. A directory holding anything else is refused and left untouched; an existing
        dump is refused too (reopen it with :meth:`DumpWriter.append`).
    workload : workload or model name.
    params : ``(name, shape)`` of every parameter, in model order.
    workers : number of workers P whose gradients each step holds.
    dtype : storage dtype, ``float32`` (default), ``float16`` or ``bfloat16``.
    every : recording interval K in training steps (informative).
    optimizer, seeds, metadata : JSON-serialisable dicts stored in the manifest (``metadata`` is free-form).
    extras : names of the extra tensors every step holds (e.g. ``["residual", "compensated"]``).
    compression : the compressor/feedback in the training loop (``{"compressor": spec, "feedback": spec}``) or None.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        workload: str,
        params: Sequence[tuple[str, Sequence[int]]],
        workers: int = 1,
        dtype: str = "float32",
        every: int = 1,
        optimizer: Mapping[str, Any] | None = None,
        seeds: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        extras: Sequence[str] = (),
        compression: Mapping[str, Any] | None = None,
    ) -> None:
        path = Path(path)
        storage_dtype(dtype)
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        if not params:
            raise ValueError("params is empty: a dump needs at least one (name, shape) parameter")
        names = [n for n, _ in params]
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"parameter names must be distinct non-empty strings, got {names}")
        if any("/" in e or not e for e in extras):
            raise ValueError(f"extra names must be non-empty and hold no '/', got {list(extras)}")
        check_new_dump_dir(path)
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "workload": str(workload),
            "dtype": dtype,
            "params": [{"name": n, "shape": [int(s) for s in shape], "dtype": dtype} for n, shape in params],
            "workers": workers,
            "every": every,
            "extras": list(extras),
            "optimizer": dict(optimizer or {}),
            "seeds": dict(seeds or {}),
            "compression": dict(compression or {}),
            "versions": library_versions(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "metadata": dict(metadata or {}),
            "steps": [],
        }
        json.dumps(manifest)  # fail now, before touching the disk, if something is not JSON-serialisable
        path.mkdir(parents=True, exist_ok=True)
        self._init(path, manifest)
        self._save_manifest()

    @classmethod
    def append(cls, path: str | Path) -> "DumpWriter":
        """Reopen an existing dump for writing further steps; leftovers of an interrupted write are removed."""
        path = Path(path)
        manifest = read_manifest(path)
        self = cls.__new__(cls)
        self._init(path, manifest)
        committed = {e["file"] for e in manifest["steps"]}
        for f in path.iterdir():
            leftover = f.name.endswith(TMP_SUFFIX) or (STEP_FILE.match(f.name) and f.name not in committed)
            if leftover and f.is_file():
                f.unlink()
        return self

    def _init(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self._dtype = storage_dtype(manifest["dtype"])
        self._shapes = {p["name"]: tuple(p["shape"]) for p in manifest["params"]}

    # -- writing --------------------------------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        return [e["step"] for e in self.manifest["steps"]]

    def write_step(self, step: int, grads: WorkerTensors, extras: Mapping[str, WorkerTensors] | None = None) -> None:
        """Write one recorded step: ``grads`` holds one ``{param: tensor}`` dict per worker; ``extras`` maps each
        declared extra name to one such dict per worker. Steps must be written in increasing order.

        The step file is written atomically, then the manifest is rewritten atomically; a crash at any point
        leaves a dump holding every step committed before it.
        """
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        if self.steps and step <= self.steps[-1]:
            raise DumpError(f"{self.path}: step {step} is not after the last recorded step {self.steps[-1]}")
        extras = dict(extras or {})
        if set(extras) != set(self.manifest["extras"]):
            raise ValueError(f"step {step}: extras {sorted(extras)} differ from the dump's {self.manifest['extras']}")
        tensors: dict[str, torch.Tensor] = {}
        self._storages: set[int] = set()
        self._collect(tensors, grads, grad_key, f"step {step} gradients")
        for name in self.manifest["extras"]:
            self._collect(tensors, extras[name], functools.partial(extra_key, name), f"step {step} extra {name!r}")
        self._storages.clear()
        meta = {checksum_key(k): sha256_tensor(t) for k, t in tensors.items()}
        data = safetensors_bytes(tensors, metadata=meta)
        file = step_file(step)
        write_atomic(self.path / file, data)
        self.manifest["steps"].append({"step": step, "file": file, "bytes": len(data), "sha256": sha256_bytes(data)})
        try:
            self._save_manifest()
        except BaseException:
            self.manifest["steps"].pop()
            with contextlib.suppress(OSError):
                (self.path / file).unlink()
            raise

    def commit_rank_parts(self, step: int) -> None:
        """Assemble the part files of ``step`` written by ranks ``0 .. workers - 1`` (:func:`write_rank_part`)
        into the step file (validated and committed like :meth:`write_step`), then remove the parts."""
        files = [self.path / rank_part_file(step, r) for r in range(self.manifest["workers"])]
        try:
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise DumpError(f"{self.path}: step {step}: rank part files missing: {missing}")
            grads: list[dict[str, torch.Tensor]] = []
            extras: dict[str, list[dict[str, torch.Tensor]]] = {e: [] for e in self.manifest["extras"]}
            for f in files:
                tensors = safetensors_load(f.read_bytes())
                grads.append({k[len(PART_GRAD) :]: t for k, t in tensors.items() if k.startswith(PART_GRAD)})
                for e in extras:
                    prefix = f"{PART_EXTRA}{e}/"
                    extras[e].append({k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)})
            self.write_step(step, grads, extras)
        finally:  # committed or not (a full disk), the parts are not kept
            for f in files:
                with contextlib.suppress(OSError):
                    f.unlink()

    def _collect(
        self, out: dict[str, torch.Tensor], per_worker: WorkerTensors, key: Callable[[int, str], str], what: str
    ) -> None:
        if len(per_worker) != self.manifest["workers"]:
            raise ValueError(f"{what}: expected {self.manifest['workers']} worker dicts, got {len(per_worker)}")
        for w, named in enumerate(per_worker):
            if set(named) != set(self._shapes):
                missing, extra = set(self._shapes) - set(named), set(named) - set(self._shapes)
                raise ValueError(f"{what}, worker {w}: missing parameters {sorted(missing)}, unknown {sorted(extra)}")
            for name, shape in self._shapes.items():
                t = named[name]
                if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                    raise TypeError(
                        f"{what}, worker {w}, {name!r}: expected a floating-point tensor, got "
                        f"{type(t).__name__}{'' if not isinstance(t, torch.Tensor) else ' ' + str(t.dtype)}"
                    )
                if tuple(t.shape) != shape:
                    raise ValueError(f"{what}, worker {w}, {name!r}: shape {tuple(t.shape)}, the dump declares {shape}")
                t = t.detach().to(device="cpu", dtype=self._dtype).contiguous()
                if t.untyped_storage().data_ptr() in self._storages:  # safetensors refuses shared memory
                    t = t.clone()
                self._storages.add(t.untyped_storage().data_ptr())
                if not bool(torch.isfinite(t).all()):
                    raise ValueError(
                        f"{what}, worker {w}, {name!r}: holds NaN/Inf values (after conversion to "
                        f"{self.manifest['dtype']})"
                    )
                out[key(w, name)] = t

    def _save_manifest(self) -> None:
        write_atomic(self.path / MANIFEST, (json.dumps(self.manifest, indent=1) + "\n").encode("utf-8"))


PART_GRAD = "g/"
PART_EXTRA = "x/"


def rank_part_file(step: int, rank: int) -> str:
    """Name of rank ``rank``'s part of ``step`` (hidden, ending in the temporary suffix readers ignore)."""
    return f".step-{step:08d}.rank-{rank}.part{TMP_SUFFIX}"


def write_rank_part(
    path: str | Path,
    step: int,
    rank: int,
    grads: Mapping[str, torch.Tensor],
    extras: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> None:
    """Write one rank's gradients (``{param: tensor}``) and extras (``{extra: {param: tensor}}``) of ``step``
    atomically into the dump at ``path``; :meth:`DumpWriter.commit_rank_parts` on rank 0 assembles them."""
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
    tensors = {f"{PART_GRAD}{n}": t.detach().cpu().contiguous() for n, t in grads.items()}
    for e, named in (extras or {}).items():
        tensors.update({f"{PART_EXTRA}{e}/{n}": t.detach().cpu().contiguous() for n, t in named.items()})
    write_atomic(Path(path) / rank_part_file(step, rank), safetensors_bytes(tensors))


def remove_leftovers(path: str | Path) -> list[Path]:
    """Remove the temporary files of interrupted writes and uncommitted rank parts from the dump directory ``path``
    (after a failed recording: the committed steps stay); the files removed."""
    path = Path(path)
    if not path.is_dir():
        return []
    found = leftovers(path)
    for f in found:
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    return found


def check_new_dump_dir(path: Path) -> None:
    """Refuse anything but a missing or empty directory (an existing dump, or a directory holding other files).

    A directory holding nothing but temporary files of an interrupted gradstat write (``.manifest.json.<pid>.tmp``,
    ``.step-*.safetensors.<pid>.tmp``) is an unfinished dump: those files are removed and the directory is used."""
    if path.exists() and not path.is_dir():
        raise DumpError(f"{path}: exists and is not a directory; refusing to write a dump there")
    if path.is_dir() and is_unfinished(path):  # only an interrupted write's temporary files: an unfinished dump
        for leftover in leftovers(path):
            leftover.unlink()
    if path.is_dir() and any(path.iterdir()):
        if (path / MANIFEST).is_file():
            raise DumpError(f"{path}: already holds a gradient dump; reopen it to append or choose a new directory")
        raise DumpError(f"{path}: directory is not empty and is not a gradstat dump; refusing to touch it")
