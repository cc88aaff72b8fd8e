"""gradstat's own small C loops: built with the machine's C compiler at first use, cached on disk, loaded by ctypes.

Some hot loops cannot be written as one ``torch.compile`` kernel (a compaction, whose output length depends on the
data) or come out of its code generation at twice the cost they need (a loop that stores int8 codes goes through
torch's partial vector store). For those, a module keeps a short C source of its own (no third-party code) and asks
:func:`library` for it: compiled once per source, compiler command and machine (``-O2``, a fraction of a second),
cached in ``$GRADSTAT_CACHE/kernels`` (default root ``$XDG_CACHE_HOME/gradstat``, else ``~/.cache/gradstat``) and
written atomically, so concurrent processes see a whole library or none. Callers split a long loop across torch's
threads (:func:`pieces`, :func:`run_all`), as torch's own kernels would use them. Where no C compiler is found
(``$CC``, e.g. ``ccache gcc``, when its program is on the path, else cc, gcc or clang), on Windows, where a build
fails (one warning) or under ``GRADSTAT_COMPILE=never`` (:mod:`gradstat.theory.fused`), :func:`library` gives None
and the callers keep their torch or numpy path; their tests hold both to the same plain reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import torch

from gradstat.theory.fused import policy

T = TypeVar("T")

ENV_CACHE = "GRADSTAT_CACHE"
"""Directory for built libraries (default: ``$XDG_CACHE_HOME/gradstat``, else ``~/.cache/gradstat``)."""

FLAGS = ("-O2", "-std=c99", "-ffp-contract=off", "-shared", "-fPIC")
"""Compiler flags: no contraction of a multiply and an add into one FMA, so float arithmetic rounds as torch's."""

Signature = tuple[object, list[object]]
"""``(restype, argtypes)`` of an exported C function, as ctypes takes them."""

_LOCK = threading.Lock()
_BUILT: dict[str, ctypes.CDLL | None] = {}


def compiler() -> list[str] | None:
    """The C compiler command to build with: ``$CC`` (its words, e.g. ``ccache gcc``) when its program is on the
    path, else the first of cc, gcc, clang on the path; None when there is none."""
    words = shlex.split(os.environ.get("CC", ""))
    if words and shutil.which(words[0]):
        return [str(shutil.which(words[0])), *words[1:]]
    path = next((p for p in map(shutil.which, ("cc", "gcc", "clang")) if p), None)
    return None if path is None else [path]


def cache_dir() -> Path:
    """Where built libraries are kept (see :data:`ENV_CACHE`)."""
    root = os.environ.get(ENV_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gradstat"
    )
    return Path(root) / "kernels"


def library(name: str, source: str, functions: dict[str, Signature]) -> ctypes.CDLL | None:
    """The library ``name`` built from ``source`` with ``functions`` typed, once per process (None: see the module
    docstring; the compile policy is checked on every call, the build once)."""
    if policy() == "never":
        return None
    with _LOCK:
        if name not in _BUILT:
            _BUILT[name] = _build(name, source, functions)
        return _BUILT[name]


def forget() -> None:
    """Drop the loaded libraries' handles from this process's table (a later call builds or loads them again)."""
    with _LOCK:
        _BUILT.clear()


def _build(name: str, source: str, functions: dict[str, Signature]) -> ctypes.CDLL | None:
    cc = compiler()
    if cc is None or sys.platform == "win32":
        return None
    tag = "\0".join((source, *cc, *FLAGS, platform.machine(), platform.system()))
    path = cache_dir() / f"{name}-{hashlib.sha256(tag.encode()).hexdigest()[:20]}.so"
    try:
        try:
            lib = _load(path, functions)
        except (OSError, AttributeError):  # none cached yet, or a cached file that does not load: build it afresh
            _compile(cc, name, source, path)
            lib = _load(path, functions)
    except (OSError, subprocess.SubprocessError, AttributeError) as exc:
        detail = (getattr(exc, "stderr", None) or str(exc)).strip()
        warnings.warn(
            f"gradstat: the C kernels {name!r} could not be built or loaded ({type(exc).__name__}: "
            f"{detail.splitlines()[0] if detail else ''}); the torch or numpy path runs instead",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    return lib


def _load(path: Path, functions: dict[str, Signature]) -> ctypes.CDLL:
    if not path.exists():
        raise FileNotFoundError(path)
    lib = ctypes.CDLL(str(path))
    for fname, (restype, argtypes) in functions.items():
        fn = getattr(lib, fname)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _compile(cc: list[str], name: str, source: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        src = Path(work) / f"{name}.c"
        src.write_text(source)
        built = Path(work) / path.name
        cmd = [*cc, *FLAGS, "-o", str(built), str(src), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, text=True, errors="replace", timeout=120)
        os.replace(built, path)  # atomic: a concurrent process sees the whole library or none


PARALLEL_MIN = 1 << 20
"""Elements from which a C loop is split across threads (below, one thread's pass takes well under a
millisecond and the hand-off would cost more than it saves)."""

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """After a fork the child has the pool object but none of its threads: it starts a pool of its own, and its
    locks afresh (one held by another thread of the parent at the fork would never be released here)."""
    global _POOL, _POOL_LOCK, _LOCK
    _POOL, _POOL_LOCK, _LOCK = None, threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def pieces(n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges splitting ``n`` elements into one piece per thread torch uses
    (``torch.get_num_threads()``), from :data:`PARALLEL_MIN` elements up; one piece below."""
    parts = min(torch.get_num_threads(), max(1, n // (PARALLEL_MIN // 2))) if n >= PARALLEL_MIN else 1
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]] or [(0, n)]


def run_all(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``calls`` (C loops: ctypes releases the GIL while they run) on a shared thread pool, the first in this
    thread; their results in order. One call runs here directly."""
    if len(calls) <= 1:
        return [c() for c in calls]
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < len(calls) - 1:  # noqa: SLF001 - the pool's own size
            if _POOL is not None:
                _POOL.shutdown(wait=False)  # (its threads end once idle; work already given to it still runs)
            _POOL = ThreadPoolExecutor(max_workers=len(calls) - 1, thread_name_prefix="gradstat-native")
        pool = _POOL
    futures = [pool.submit(c) for c in calls[1:]]
    first = calls[0]()
    return [first, *(f.result() for f in futures)]
