"""The folder where ``torch.compile`` keeps the kernels it builds: one the user owns, never one another user can write.

torch's inductor writes the C++ it generates, and the shared libraries it builds from it, into
``$TORCHINDUCTOR_CACHE_DIR``, by default ``<temporary directory>/torchinductor_<user name>``, and loads them from
there in later processes. In a shared temporary directory another user can create that folder first, and then
place libraries there that this user's process would load and run. So before gradstat's first compiled kernel
(:mod:`gradstat.theory.kernels.fused`):

- where the environment does not name a folder, ``TORCHINDUCTOR_CACHE_DIR`` is set to ``<cache>/torchinductor``
  (``<cache>``: ``$GRADSTAT_CACHE``, else ``$XDG_CACHE_HOME/gradstat``, else ``~/.cache/gradstat``), created with
  mode 0700;
- the folder in use, whether gradstat or the user chose it, must be a real folder (not a link) owned by this user
  and writable by no one else; otherwise :class:`UnsafeCacheError` is raised (the fused kernels then stay eager,
  with one warning).

On a system without POSIX users (Windows) only the folder's kind is checked.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

ENV_INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"
ENV_CACHE = "GRADSTAT_CACHE"
"""gradstat's cache root (default ``$XDG_CACHE_HOME/gradstat``, else ``~/.cache/gradstat``)."""


class UnsafeCacheError(RuntimeError):
    """The compiled kernels' cache folder could be written by another user (or is not a folder of this user)."""


def cache_root() -> Path:
    """gradstat's cache root (see :data:`ENV_CACHE`)."""
    root = os.environ.get(ENV_CACHE)
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradstat"


def _private_folder(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700; an existing one is left as it is (then checked)."""
    for folder in reversed([path, *path.parents]):
        if not folder.exists():
            try:
                folder.mkdir(mode=0o700)
            except FileExistsError:  # created meanwhile by a concurrent process: checked below like any other
                pass


def check_private(path: Path) -> None:
    """Raise :class:`UnsafeCacheError` unless ``path`` is a folder (not a link) of this user that no other user can
    write (see the module docstring)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UnsafeCacheError(f"the compiled kernels' cache folder {path} cannot be used: {exc}") from exc
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeCacheError(f"the compiled kernels' cache folder {path} is not a folder (a link or a file)")
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return
    if info.st_uid != getuid():
        raise UnsafeCacheError(
            f"the compiled kernels' cache folder {path} belongs to user id {info.st_uid}, not to this user "
            f"({getuid()}): set {ENV_INDUCTOR} to a folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(
            f"the compiled kernels' cache folder {path} can be written by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): make it private (chmod go-w) or set {ENV_INDUCTOR} to another folder"
        )


def ensure_compile_cache() -> Path:
    """The folder torch.compile will use, made safe first: gradstat's own private folder where the environment
    names none (and :data:`ENV_INDUCTOR` set to it), else the named one; created with mode 0700 where missing, and
    checked (:func:`check_private`)."""
    named = os.environ.get(ENV_INDUCTOR)
    path = Path(os.path.abspath(named)) if named else cache_root() / "torchinductor"
    try:
        _private_folder(path)
    except OSError as exc:
        raise UnsafeCacheError(f"the compiled kernels' cache folder {path} cannot be created: {exc}") from exc
    check_private(path)
    if not named:
        os.environ[ENV_INDUCTOR] = str(path)
    return path
