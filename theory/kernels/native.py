"""gradstat's own small C loops: the extension module ``_native``, built by the package build, and their threads.

Some hot loops cannot be written as one ``torch.compile`` kernel (a compaction, whose output length depends on the
data) or come out of its code generation at twice the cost they need (a loop that stores int8 codes goes through
torch's partial vector store). For those, ``theory/kernels/_native.c`` holds a short C source of gradstat's
own (no third-party code), which ``setup.py`` compiles into ``gradstat.theory.kernels._native`` when the package
is installed (an editable install builds it in place). Nothing is compiled, cached or loaded from elsewhere at run
time. The module works on raw buffers (numpy views of CPU tensors), checks their types and lengths, and releases the
GIL in its loops, so callers split a long loop across torch's threads (:func:`pieces`, :func:`run_all`), as torch's
own kernels would use them.

:func:`extension` gives the module, or None, and the callers keep their torch or numpy path, where:

- the package was installed without it (no C compiler at install time; :func:`absent_reason` says so);
- it was built from another version of its source (a stale in-place build: rebuild with ``pip install -e .``);
- the compile policy is ``never`` (``GRADSTAT_COMPILE``, or :func:`gradstat.theory.kernels.policy.forced`): the one
  switch for every accelerated path, read on each call, so one process can run both paths.

The callers' tests hold both paths to the same plain reference, bit for bit.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import torch

from gradstat.theory.kernels.policy import native_allowed

T = TypeVar("T")

SOURCE = Path(__file__).with_name("_native.c")
"""The extension's C source, where it ships beside the module (a source checkout, an editable install)."""


def _load() -> tuple[ModuleType | None, str | None, bool]:
    """The built extension, or None and why it cannot be used, and whether it is a stale build."""
    try:
        from gradstat.theory.kernels import _native
    except ImportError as exc:
        return None, f"the C extension was not built when gradstat was installed ({exc})", False
    if SOURCE.is_file() and _native.SOURCE_DIGEST != hashlib.sha256(SOURCE.read_bytes()).hexdigest():
        name = Path(_native.__file__ or "_native").name
        return None, f"the C extension {name} was built from another version of {SOURCE.name}: rebuild it", True
    return _native, None, False


_EXTENSION, _ABSENT, _STALE = _load()
_WARNED = False


def extension() -> ModuleType | None:
    """The C loops' module, or None (see the module docstring); one warning per process for a stale build."""
    global _WARNED
    if not native_allowed():
        return None
    if _STALE and not _WARNED:
        _WARNED = True
        warnings.warn(
            f"gradstat: {_ABSENT} (pip install -e .); the torch or numpy path runs instead",
            RuntimeWarning,
            stacklevel=3,
        )
    return _EXTENSION


def built() -> bool:
    """Whether the C extension is installed and current (whatever the compile policy)."""
    return _EXTENSION is not None


def absent_reason() -> str | None:
    """Why the C extension cannot be used (None where it can)."""
    return _ABSENT


PARALLEL_MIN = 1 << 20
"""Elements from which a C loop is split across threads (below, one thread's pass takes well under a
millisecond and the hand-off would cost more than it saves)."""

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """After a fork the child has the pool object but none of its threads: it starts a pool of its own, and its
    lock afresh (one held by another thread of the parent at the fork would never be released here)."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def pieces(n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges splitting ``n`` elements into one piece per thread torch uses
    (``torch.get_num_threads()``), from :data:`PARALLEL_MIN` elements up; one piece below."""
    parts = min(torch.get_num_threads(), max(1, n // (PARALLEL_MIN // 2))) if n >= PARALLEL_MIN else 1
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]] or [(0, n)]


def run_all(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``calls`` (C loops, which release the GIL while they run) on a shared thread pool, the first in this
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


NUMPY_DTYPES = (torch.float32, torch.float64)
"""The floating dtypes numpy and the C loops read as they are."""


def cpu_contiguous(x: torch.Tensor, dtypes: tuple[torch.dtype, ...] = NUMPY_DTYPES) -> bool:
    """Whether numpy (or a C loop) can work on ``x``'s own memory: a contiguous CPU tensor of one of ``dtypes``."""
    return x.device.type == "cpu" and x.dtype in dtypes and x.is_contiguous()


def reads_float32(x: torch.Tensor) -> bool:
    """Whether the C loops can read ``x``'s own memory as float32: a contiguous float32 CPU tensor, not needing
    grad (a plain buffer), and the extension in use (see :func:`extension`)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.is_contiguous()
        and not x.requires_grad
        and extension() is not None
    )
