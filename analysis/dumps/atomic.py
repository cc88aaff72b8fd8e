"""Atomic file replacement: write to a temporary name in the same directory, fsync, rename, fsync the directory.

A reader sees either the old file or the complete new one, whatever happens to the writing process (SIGKILL
included). On failure (e.g. ``ENOSPC``) the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gradstat.analysis.dumps.format import TMP_SUFFIX


class WriteError(OSError):
    """An OSError (same errno) whose message names the target file, printed without the ``[Errno N]`` prefix."""

    def __str__(self) -> str:
        return str(self.strerror)


def tmp_name(target: Path) -> Path:
    """Temporary sibling of ``target`` (hidden, with the ``.tmp`` suffix that readers ignore)."""
    return target.with_name(f".{target.name}.{os.getpid()}{TMP_SUFFIX}")


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(target: Path, data: bytes | memoryview) -> None:
    """Replace ``target`` by ``data`` atomically and durably.

    Raises
    ------
    OSError
        naming ``target`` (never the hidden temporary file), e.g. ``out.npz: cannot write (No space left on
        device); nothing was written``, with the original error's errno.
    """
    tmp = tmp_name(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            raise WriteError(exc.errno, f"{target}: cannot write ({reason}); {target.name} was left as it was") from exc
        raise
    fsync_dir(target.parent)
