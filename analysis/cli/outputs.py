"""The ``--out`` folder of a result command: gradstat's own earlier result is replaced (with a message), a folder
holding anything else is refused, and the command says where it wrote.

A folder written by gradstat carries a small manifest, ``.gradstat-out.json``: the command that wrote it and the
files it wrote (paths relative to the folder). The manifest is what tells gradstat's result apart from a user's
files: a folder is reused only when every file in it is listed there (or when it is empty).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Iterator

MANIFEST = ".gradstat-out.json"


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative, sorted), the manifest excluded."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _written_before(folder: Path) -> tuple[str, list[str]] | None:
    """(command, files) of gradstat's manifest in ``folder``; None without one; ValueError if unreadable."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return str(data["command"]), [str(f) for f in data["files"]]
    except (ValueError, KeyError, TypeError):
        raise ValueError(
            f"--out {folder}: {MANIFEST} is not a gradstat output manifest; choose another folder"
        ) from None


def prepare(folder: str | Path, command: str, echo: Callable[[str], None]) -> Path:
    """Make ``folder`` ready for ``command``'s result: create it, or clear gradstat's earlier result there.

    Raises
    ------
    ValueError : ``folder`` is a file, or holds files gradstat did not write (nothing is removed then).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder}: is a file, not a folder")
    if not folder.exists():
        folder.mkdir(parents=True)
        return folder
    present = _files(folder)
    before = _written_before(folder)
    ours = set(before[1]) if before else set()
    foreign = [f for f in present if f not in ours]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ValueError(f"--out {folder}: holds files gradstat did not write ({shown}); choose an empty or new folder")
    if before and present:
        top = sorted({f.split("/")[0] + ("/" if "/" in f else "") for f in present})
        shown = ", ".join(top[:6]) + (", ..." if len(top) > 6 else "")
        echo(f"replacing the earlier result of `gradstat {before[0]}` in {folder}/ ({len(present)} files: {shown})")
        for f in present:
            (folder / f).unlink()
        for d in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
    return folder


def record(folder: Path, command: str) -> list[str]:
    """Write the manifest listing every file now in ``folder`` as written by ``command``; return the files."""
    from gradstat.analysis.measure.tables import atomic_write_text  # not at import: --help stays light

    files = _files(folder)
    atomic_write_text(folder / MANIFEST, json.dumps({"command": command, "files": files}, indent=1))
    return files


@contextlib.contextmanager
def output_folder(folder: str | Path, command: str, echo: Callable[[str], None]) -> Iterator[Path]:
    """``prepare`` the folder, yield it, then ``record`` what was written (also when the command fails, so a
    partial result is still recognised as gradstat's) and say where it is."""
    path = prepare(folder, command, echo)
    ok = False
    try:
        yield path
        ok = True
    finally:
        try:
            files = record(path, command)
        except OSError:
            if ok:
                raise
            files = []  # the command's own error (a full disk, say) is the one to report
        if ok:
            echo(f"\nwrote {len(files)} files to {path}/")
