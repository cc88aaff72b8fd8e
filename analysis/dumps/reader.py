"""Reading gradient dumps lazily: :func:`open_dump` validates the manifest and the files' presence and sizes;
each read opens (memory-maps) one step file and copies only the requested tensors, checking their sha256."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import torch
from safetensors import SafetensorError, safe_open

from analysis.dumps.format import (MANIFEST, SAFETENSORS_DTYPES, STEP_FILE, TMP_SUFFIX, DumpError, checksum_key,
                                   expected_keys, extra_key, grad_key, numel, read_manifest, sha256_file,
                                   sha256_tensor, storage_dtype)

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
        self._header_ok: set[int] = set()
        self.uncommitted: list[str] = []
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
        return (f"Dump({str(self.path)!r}, workload={self.workload!r}, steps={len(self._entries)}, "
                f"workers={self.workers}, params={len(self._shapes)}, numel={self.numel})")

    # -- reading ----------------------------------------------------------------------------------------------
    def read(self, step: int, worker: int = 0, params: Params = None, device: torch.device | str | None = None,
             dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Gradients of ``worker`` at ``step``: ``{param: tensor}`` in model order (all parameters, one name, or
        a list of names), moved to ``device``/``dtype`` when given (default: CPU, storage dtype)."""
        names = self._params(params)
        return self._read(step, [grad_key(self._worker(worker), n) for n in names], names, device, dtype)

    def flat(self, step: int, worker: int = 0, device: torch.device | str | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole gradient of ``worker`` at ``step`` as one 1-D tensor of length :attr:`numel`, model order."""
        return _concat(self.read(step, worker, None, device, dtype))

    def read_extra(self, name: str, step: int, worker: int = 0, params: Params = None,
                   device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Extra tensor ``name`` (e.g. ``residual``) of ``worker`` at ``step``, like :meth:`read`."""
        if name not in self.manifest["extras"]:
            raise DumpError(f"{self.path}: no extra {name!r}; this dump holds {self.extras or 'no extras'}")
        names = self._params(params)
        return self._read(step, [extra_key(name, self._worker(worker), n) for n in names], names, device, dtype)

    def flat_extra(self, name: str, step: int, worker: int = 0, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        """Extra tensor ``name`` of ``worker`` at ``step`` as one 1-D tensor in model order."""
        return _concat(self.read_extra(name, step, worker, None, device, dtype))

    def verify(self) -> None:
        """Check every step file completely: size and sha256 against the manifest, header, every tensor's sha256."""
        self._check_files()
        for step, entry in self._entries.items():
            file = self.path / entry["file"]
            if sha256_file(file) != entry["sha256"]:
                raise DumpError(f"{file}: checksum mismatch (the file differs from what was recorded)")
            keys = expected_keys(self.manifest["params"], self.workers, self.extras)
            self._header_ok.discard(step)
            self._read(step, keys, keys, None, None, verify=True)

    # -- internals --------------------------------------------------------------------------------------------
    def _entry(self, step: int) -> dict[str, Any]:
        try:
            return self._entries[step]
        except (KeyError, TypeError):
            shown = self.steps if len(self._entries) <= 12 else self.steps[:6] + ["..."] + self.steps[-3:]
            raise DumpError(f"{self.path}: step {step!r} was not recorded; recorded steps: {shown}") from None

    def _worker(self, worker: int) -> int:
        if not isinstance(worker, int) or not 0 <= worker < self.workers:
            raise DumpError(f"{self.path}: worker {worker!r} out of range; this dump holds workers 0..{self.workers - 1}")
        return worker

    def _params(self, params: Params) -> list[str]:
        if params is None:
            return self.params
        names = [params] if isinstance(params, str) else list(params)
        unknown = [n for n in names if n not in self._shapes]
        if unknown or not names:
            raise DumpError(f"{self.path}: unknown parameter(s) {unknown or names}; parameters are {self.params}")
        return names

    def _check_files(self) -> None:
        committed = {e["file"]: e for e in self._entries.values()}
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

    def _read(self, step: int, keys: list[str], names: list[str], device, dtype, verify: bool | None = None
              ) -> dict[str, torch.Tensor]:
        file = self.file(step)
        verify = self.check if verify is None else verify
        out: dict[str, torch.Tensor] = {}
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                if step not in self._header_ok:
                    self._check_header(file, f)
                    self._header_ok.add(step)
                sums = f.metadata() if verify else None
                for key, name in zip(keys, names):
                    t = f.get_tensor(key)
                    if sums is not None and sha256_tensor(t) != sums[checksum_key(key)]:
                        raise DumpError(f"{file}: checksum mismatch in tensor {key!r} (the data is corrupt)")
                    out[name] = t if device is None and dtype is None else t.to(device=device, dtype=dtype)
        except (SafetensorError, OSError) as exc:
            raise DumpError(f"{file}: unreadable step file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        return out

    def _check_header(self, file: Path, f: Any) -> None:
        owner = {grad_key(w, n): n for w in range(self.workers) for n in self._shapes}
        owner.update({extra_key(e, w, n): n for e in self.extras for w in range(self.workers) for n in self._shapes})
        keys = list(owner)
        present = set(f.keys())
        if present != set(keys):
            missing, extra = sorted(set(keys) - present), sorted(present - set(keys))
            raise DumpError(f"{file}: tensors do not match {MANIFEST}: missing {missing[:5]}, unexpected {extra[:5]}")
        meta = f.metadata() or {}
        want_dtype = SAFETENSORS_DTYPES[self.manifest["dtype"]]
        for key in keys:
            sl = f.get_slice(key)
            shape = tuple(sl.get_shape())
            want = self._shapes[owner[key]]
            if shape != want:
                raise DumpError(f"{file}: tensor {key!r} has shape {shape}, {MANIFEST} declares {want}")
            if sl.get_dtype() != want_dtype:
                raise DumpError(f"{file}: tensor {key!r} has dtype {sl.get_dtype()}, {MANIFEST} declares {want_dtype}")
            if checksum_key(key) not in meta:
                raise DumpError(f"{file}: no checksum for tensor {key!r} in the file header")


def _concat(named: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in named.values()])


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
