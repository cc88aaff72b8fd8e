"""Reading gradient dumps lazily: :func:`open_dump` validates the manifest and the files' presence and sizes;
a read opens one step file, validates its safetensors header once, then reads only the requested tensors' bytes
(one seek and one ``readinto`` per tensor, straight into the returned tensor) and checks their sha256."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import torch

from gradstat.analysis.dumps.format import (
    CHECKSUM,
    MANIFEST,
    SAFETENSORS_DTYPES,
    STEP_FILE,
    TMP_SUFFIX,
    DumpError,
    checksum_key,
    extra_key,
    grad_key,
    is_int,
    numel,
    read_manifest,
    sha256_bytes,
    sha256_file,
    storage_dtype,
)

Params = str | Iterable[str] | None


class Dump:
    """An open gradient dump (see :func:`open_dump`). Cheap to create; reads touch only the requested data.

    Attributes
    ----------
    path : the dump directory.
    manifest : the parsed ``manifest.json``.
    uncommitted : step files left by a write interrupted before its manifest update (ignored by reads; removed
        when the dump is reopened for appending).
    """

    def __init__(self, path: str | Path, check: bool = True) -> None:
        self.path = Path(path)
        self.manifest: dict[str, Any] = read_manifest(self.path)
        self.check = check
        self._entries = {e["step"]: e for e in self.manifest["steps"]}
        self._shapes = {p["name"]: tuple(p["shape"]) for p in self.manifest["params"]}
        self._headers: dict[int, dict[str, tuple[int, int, str]]] = {}
        self.uncommitted: list[str] = []
        self._check_sizes()
        self._check_files()

    # -- description ------------------------------------------------------------------------------------------
    @property
    def workload(self) -> str:
        return self.manifest["workload"]

    @property
    def steps(self) -> list[int]:
        """Recorded training steps, increasing."""
        return list(self._entries)

    @property
    def workers(self) -> int:
        return self.manifest["workers"]

    @property
    def params(self) -> list[str]:
        """Parameter names in model order."""
        return list(self._shapes)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    @property
    def numel(self) -> int:
        """Number of parameters (elements) per worker per step."""
        return sum(numel(s) for s in self._shapes.values())

    @property
    def extras(self) -> list[str]:
        return list(self.manifest["extras"])

    @property
    def dtype(self) -> torch.dtype:
        """Storage dtype."""
        return storage_dtype(self.manifest["dtype"])

    def file(self, step: int) -> Path:
        return self.path / self._entry(step)["file"]

    def size_on_disk(self) -> int:
        """Bytes of the manifest and every step file."""
        return (self.path / MANIFEST).stat().st_size + sum(e["bytes"] for e in self._entries.values())

    def __repr__(self) -> str:
        return (
            f"Dump({str(self.path)!r}, workload={self.workload!r}, steps={len(self._entries)}, "
            f"workers={self.workers}, params={len(self._shapes)}, numel={self.numel})"
        )

    # -- reading ----------------------------------------------------------------------------------------------
    def read(
        self,
        step: int,
        worker: int = 0,
        params: Params = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        """Gradients of ``worker`` at ``step``: ``{param: tensor}`` in model order (all parameters, one name, or
        a list of names), moved to ``device``/``dtype`` when given (default: CPU, storage dtype)."""
        names = self._params(params)
        return self._read(step, [grad_key(self._worker(worker), n) for n in names], names, device, dtype)

    def flat(
        self, step: int, worker: int = 0, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """The whole gradient of ``worker`` at ``step`` as one 1-D tensor of length :attr:`numel`, model order."""
        return self._read_flat(step, [grad_key(self._worker(worker), n) for n in self._shapes], device, dtype)

    def read_extra(
        self,
        name: str,
        step: int,
        worker: int = 0,
        params: Params = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        """Extra tensor ``name`` (e.g. ``residual``) of ``worker`` at ``step``, like :meth:`read`."""
        names = self._params(params)
        return self._read(
            step, [extra_key(self._extra(name), self._worker(worker), n) for n in names], names, device, dtype
        )

    def flat_extra(
        self,
        name: str,
        step: int,
        worker: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Extra tensor ``name`` of ``worker`` at ``step`` as one 1-D tensor in model order."""
        keys = [extra_key(self._extra(name), self._worker(worker), n) for n in self._shapes]
        return self._read_flat(step, keys, device, dtype)

    def verify(self) -> None:
        """Check every step file completely: size and sha256 against the manifest, header, every tensor's sha256."""
        self._check_files()
        for step, entry in self._entries.items():
            file = self.path / entry["file"]
            if sha256_file(file) != entry["sha256"]:
                raise DumpError(f"{file}: checksum mismatch (the file differs from what was recorded)")
            self._headers.pop(step, None)
            for w in range(self.workers):
                self._read_flat(step, [grad_key(w, n) for n in self._shapes], None, None, verify=True)
                for e in self.extras:
                    self._read_flat(step, [extra_key(e, w, n) for n in self._shapes], None, None, verify=True)

    # -- internals --------------------------------------------------------------------------------------------
    def _entry(self, step: int) -> dict[str, Any]:
        try:
            return self._entries[step]
        except (KeyError, TypeError):
            shown: list[int | str] = (
                [*self.steps] if len(self._entries) <= 12 else [*self.steps[:6], "...", *self.steps[-3:]]
            )
            raise DumpError(f"{self.path}: step {step!r} was not recorded; recorded steps: {shown}") from None

    def _worker(self, worker: int) -> int:
        if not isinstance(worker, int) or not 0 <= worker < self.workers:
            raise DumpError(
                f"{self.path}: worker {worker!r} out of range; this dump holds workers 0..{self.workers - 1}"
            )
        return worker

    def _extra(self, name: str) -> str:
        if name not in self.manifest["extras"]:
            raise DumpError(f"{self.path}: no extra {name!r}; this dump holds {self.extras or 'no extras'}")
        return name

    def _params(self, params: Params) -> list[str]:
        if params is None:
            return self.params
        names = [params] if isinstance(params, str) else list(params)
        unknown = [n for n in names if n not in self._shapes]
        if unknown or not names:
            raise DumpError(f"{self.path}: unknown parameter(s) {unknown or names}; parameters are {self.params}")
        return names

    def _check_sizes(self) -> None:
        """What the manifest declares must fit in the step files' recorded sizes: checked before anything is
        allocated or iterated per worker (a hostile manifest may declare 10^9 workers or a 10^12-element shape)."""
        tensors = self.workers * len(self._shapes) * (1 + len(self.extras))
        item = torch.empty((), dtype=self.dtype).element_size()
        data = self.workers * (1 + len(self.extras)) * self.numel * item
        for entry in self._entries.values():
            if tensors > entry["bytes"] or data > entry["bytes"]:
                raise DumpError(
                    f"{self.path / MANIFEST}: declares {self.workers:,} workers x {len(self._shapes):,} parameters x "
                    f"{1 + len(self.extras)} tensor kinds ({data:,} bytes of data per step), more than step file "
                    f"{entry['file']} holds ({entry['bytes']:,} bytes); the manifest is corrupt"
                )

    def _check_files(self) -> None:
        committed = {e["file"]: e for e in self._entries.values()}
        root = self.path.resolve()
        for name in [MANIFEST, *committed]:
            file = self.path / name
            if file.is_symlink() and not file.resolve().is_relative_to(root):
                raise DumpError(
                    f"{file}: a symbolic link to {file.resolve()}, outside the dump; refusing to read it (copy the "
                    "file into the dump instead)"
                )
        last = max(self._entries, default=-1)
        self.uncommitted = []
        for f in sorted(self.path.iterdir()):
            if f.name == MANIFEST or f.name in committed or f.name.endswith(TMP_SUFFIX):
                continue
            m = STEP_FILE.match(f.name)
            if m and int(m.group(1)) > last:
                self.uncommitted.append(f.name)
                continue
            raise DumpError(f"{f}: unexpected file in the dump (not listed in {MANIFEST})")
        for name, entry in committed.items():
            file = self.path / name
            if not file.is_file():
                raise DumpError(f"{file}: missing (step {entry['step']} is listed in {MANIFEST})")
            size = file.stat().st_size
            if size < entry["bytes"]:
                raise DumpError(f"{file}: truncated, {size} bytes instead of {entry['bytes']}")
            if size > entry["bytes"]:
                raise DumpError(f"{file}: {size} bytes, {MANIFEST} records {entry['bytes']}")

    def _read(
        self,
        step: int,
        keys: list[str],
        names: list[str],
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        verify: bool | None = None,
    ) -> dict[str, torch.Tensor]:
        self._load_header(step)  # validated against the file's size before anything is allocated
        out = {name: torch.empty(self._shapes[name], dtype=self.dtype) for name in names}
        self._read_into(step, keys, list(out.values()), verify)
        if device is None and dtype is None:
            return out
        return {n: t.to(device=device, dtype=dtype) for n, t in out.items()}

    def _read_flat(
        self,
        step: int,
        keys: list[str],
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        verify: bool | None = None,
    ) -> torch.Tensor:
        self._load_header(step)  # validated against the file's size before anything is allocated
        flat = torch.empty(self.numel, dtype=self.dtype)
        parts = list(torch.split(flat, [numel(s) for s in self._shapes.values()]))
        self._read_into(step, keys, parts, verify)
        return flat if device is None and dtype is None else flat.to(device=device, dtype=dtype)

    def _read_into(self, step: int, keys: list[str], outs: list[torch.Tensor], verify: bool | None) -> None:
        """Read tensor ``keys`` of ``step`` straight into the contiguous CPU tensors ``outs`` (one seek and one
        ``readinto`` each: only those bytes are read), checking each tensor's sha256 when ``verify``."""
        file = self.file(step)
        verify = self.check if verify is None else verify
        try:
            with open(file, "rb") as f:
                header = self._header(step, file, f)
                for key, out in zip(keys, outs, strict=True):
                    begin, end, checksum = header[key]
                    buf = memoryview(out.view(torch.uint8).numpy())  # type: ignore[arg-type]  # numpy stubs: buffer only on Python >= 3.12
                    f.seek(begin)
                    if f.readinto(buf) != end - begin:
                        raise DumpError(f"{file}: truncated inside tensor {key!r}")
                    if verify and sha256_bytes(buf) != checksum:
                        raise DumpError(f"{file}: checksum mismatch in tensor {key!r} (the data is corrupt)")
        except OSError as exc:
            raise DumpError(f"{file}: unreadable step file ({exc})") from None

    def _load_header(self, step: int) -> None:
        file = self.file(step)
        if step in self._headers:
            return
        try:
            with open(file, "rb") as f:
                self._header(step, file, f)
        except OSError as exc:
            raise DumpError(f"{file}: unreadable step file ({exc})") from None

    def _header(self, step: int, file: Path, f: Any) -> dict[str, tuple[int, int, str]]:
        """The step file's safetensors header as ``{key: (first byte, end byte, sha256)}``, validated against the
        manifest on first use (keys, dtypes, shapes, offsets, checksums present) and cached."""
        if step in self._headers:
            return self._headers[step]
        raw = f.read(8)
        size = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        file_size = self._entries[step]["bytes"]
        if not 2 <= size <= file_size - 8:
            raise DumpError(f"{file}: not a safetensors file (header length {size} in a {file_size}-byte file)")
        try:
            header = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DumpError(f"{file}: corrupt safetensors header ({exc})") from None
        except RecursionError:
            raise DumpError(f"{file}: corrupt safetensors header (JSON nested too deeply)") from None
        if not isinstance(header, dict):
            raise DumpError(f"{file}: corrupt safetensors header (not a JSON object)")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise DumpError(f"{file}: corrupt safetensors header ('__metadata__' is not an object)")
        owner = {grad_key(w, n): n for w in range(self.workers) for n in self._shapes}
        owner.update({extra_key(e, w, n): n for e in self.extras for w in range(self.workers) for n in self._shapes})
        if set(header) != set(owner):
            missing, extra = sorted(set(owner) - set(header)), sorted(set(header) - set(owner))
            raise DumpError(f"{file}: tensors do not match {MANIFEST}: missing {missing[:5]}, unexpected {extra[:5]}")
        want_dtype = SAFETENSORS_DTYPES[self.manifest["dtype"]]
        item = torch.empty((), dtype=self.dtype).element_size()
        base = 8 + size
        index: dict[str, tuple[int, int, str]] = {}
        for key, name in owner.items():
            entry = header[key]
            if not isinstance(entry, dict):
                raise DumpError(f"{file}: corrupt safetensors header (entry {key!r} is not an object)")
            shape = tuple(entry["shape"]) if isinstance(entry.get("shape"), list) else None
            want = self._shapes[name]
            if shape != want:
                raise DumpError(f"{file}: tensor {key!r} has shape {shape}, {MANIFEST} declares {want}")
            if entry.get("dtype") != want_dtype:
                raise DumpError(
                    f"{file}: tensor {key!r} has dtype {entry.get('dtype')}, {MANIFEST} declares {want_dtype}"
                )
            offsets = entry.get("data_offsets")
            ok = isinstance(offsets, list) and len(offsets) == 2 and all(is_int(v) for v in offsets)
            begin, end = offsets if ok and isinstance(offsets, list) else (0, -1)
            if not ok or begin < 0 or end - begin != numel(want) * item or base + end > file_size:
                raise DumpError(f"{file}: tensor {key!r} has bad data offsets {offsets!r}")
            checksum = meta.get(checksum_key(key))
            if checksum is None:
                raise DumpError(
                    f"{file}: the checksum field {checksum_key(key)!r} of tensor {key!r} is missing from the header"
                )
            if not isinstance(checksum, str) or not CHECKSUM.match(checksum):
                raise DumpError(
                    f"{file}: the checksum field {checksum_key(key)!r} must be 'sha256:' and 64 hex digits, "
                    f"got {str(checksum)[:80]!r}"
                )
            index[key] = (base + begin, base + end, checksum)
        spans = sorted((b, e, k) for k, (b, e, _) in index.items() if e > b)
        for (_, end0, k0), (begin1, _, k1) in zip(spans, spans[1:], strict=False):
            if begin1 < end0:
                raise DumpError(f"{file}: tensors {k0!r} and {k1!r} overlap in the file (corrupt or forged header)")
        self._headers[step] = index
        return index


def open_dump(path: str | Path, check: bool = True) -> Dump:
    """Open the gradient dump at ``path``.

    Validates the manifest (JSON, schema, format version) and that every listed step file is present with its
    recorded size and nothing unexpected lies beside them. Step files are opened only when read; a read checks
    the file's header against the manifest (keys, shapes, dtypes) and, with ``check`` (default), the sha256 of
    every tensor it returns. :meth:`Dump.verify` checks everything.

    Raises
    ------
    DumpError
        naming the file and the problem.
    """
    return Dump(path, check=check)
