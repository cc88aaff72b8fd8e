"""Failures while writing leave nothing behind: a full disk (ENOSPC, simulated by a write that fails after part of
its bytes) removes the temporary file and names the path it was writing; a failed import removes the dump it
started; a recording step that cannot be committed removes the ranks' part files."""

from __future__ import annotations

import errno
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gradstat.analysis.cli.main import main
from gradstat.analysis.dumps import DumpError, atomic
from gradstat.analysis.dumps.convert import import_dump
from gradstat.analysis.dumps.format import TMP_SUFFIX, is_unfinished
from gradstat.analysis.dumps.writer import (
    DumpWriter,
    check_new_dump_dir,
    rank_part_file,
    remove_leftovers,
    write_rank_part,
)
from gradstat.analysis.measure import tables


class FullDisk(io.FileIO):
    """A file whose writes store ``room`` bytes and then fail with ENOSPC, as a full disk does."""

    room = 16

    def write(self, data):  # type: ignore[override]
        super().write(bytes(memoryview(data)[: self.room]))
        raise OSError(errno.ENOSPC, "No space left on device")


def full_disk_open(file, mode="r", *args, **kwargs):
    if "w" in mode:
        return FullDisk(file, "w")
    return open(file, mode, *args, **kwargs)


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_an_atomic_write_on_a_full_disk_removes_its_temporary_and_names_the_target(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    target.write_text("before")
    monkeypatch.setattr(atomic, "open", full_disk_open, raising=False)
    with pytest.raises(OSError, match=rf"{target}: cannot write \(No space left on device\)") as info:
        atomic.write_atomic(target, b"x" * 1000)
    assert info.value.errno == errno.ENOSPC
    assert files(tmp_path) == ["manifest.json"] and target.read_text() == "before"


def test_a_table_on_a_full_disk_removes_its_temporary_and_names_the_file(tmp_path, monkeypatch):
    def full(self, text, encoding=None):
        Path.write_bytes(self, text.encode()[:16])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match=rf"{tmp_path / 'fit.csv'}: cannot write \(No space left on device\)"):
        tables.write_table(pd.DataFrame({"a": [1.0]}), tmp_path, "fit")
    assert files(tmp_path) == []


def _sources(tmp_path: Path, shapes: list[int]) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i, n in enumerate(shapes):
        np.save(src / f"g{i}.npy", np.arange(n, dtype=np.float32))
    return src


def test_a_failed_import_removes_the_dump_it_started(tmp_path):
    src = _sources(tmp_path, [4, 4, 5])  # the third step does not match the first two
    with pytest.raises(DumpError, match=r"g2.npy: .*nothing was imported \(the partial dump at .* was removed\)"):
        import_dump(src, tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_an_import_on_a_full_disk_removes_the_dump_it_started_and_keeps_an_empty_folder(tmp_path, monkeypatch):
    src = _sources(tmp_path, [4, 4, 4])
    (tmp_path / "d").mkdir()
    calls = []

    def second_step_fails(target, data):
        calls.append(target.name)
        if len(calls) == 4:  # manifest, step 0, manifest, step 1: the disk fills there
            raise atomic.WriteError(errno.ENOSPC, f"{target}: cannot write (No space left on device)")
        return write_atomic(target, data)

    import gradstat.analysis.dumps.writer as writer

    write_atomic = writer.write_atomic
    monkeypatch.setattr(writer, "write_atomic", second_step_fails)
    with pytest.raises(OSError, match="No space left on device"):
        import_dump(src, tmp_path / "d")
    assert files(tmp_path / "d") == []


def test_gradstat_info_refuses_what_a_failed_import_left(tmp_path, capsys):
    src = _sources(tmp_path, [4, 5])
    assert main(["import", str(src), "--out", str(tmp_path / "d")]) == 2
    assert "was removed" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "d")]) == 2
    assert str(tmp_path / "d") in capsys.readouterr().err


def _recording(tmp_path: Path) -> DumpWriter:
    return DumpWriter(tmp_path / "d", workload="w", params=[("p", (3,))], workers=2)


def test_a_step_that_cannot_be_committed_removes_the_ranks_parts(tmp_path, monkeypatch):
    w = _recording(tmp_path)
    for rank in range(2):
        write_rank_part(w.path, 0, rank, {"p": torch.ones(3)})
    monkeypatch.setattr(atomic, "open", full_disk_open, raising=False)
    with pytest.raises(OSError, match="step-00000000.safetensors: cannot write"):
        w.commit_rank_parts(0)
    assert files(w.path) == ["manifest.json"] and w.steps == []


def test_parts_of_a_killed_recording_are_leftovers_removed_after_it(tmp_path):
    w = _recording(tmp_path)
    write_rank_part(w.path, 0, 0, {"p": torch.ones(3)})
    (w.path / f".{rank_part_file(0, 1)}.77{TMP_SUFFIX}").write_bytes(b"half")  # rank 1 killed mid-write
    parts = [f for f in files(w.path) if f != "manifest.json"]
    assert len(parts) == 2 and [p.name for p in remove_leftovers(w.path)] == parts
    assert files(w.path) == ["manifest.json"]


def test_a_folder_holding_only_part_files_is_an_unfinished_dump(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / rank_part_file(3, 0)).write_bytes(b"part")
    assert is_unfinished(d)
    check_new_dump_dir(d)
    assert files(d) == []


def test_fit_on_a_full_disk_names_the_file_and_leaves_no_temporary(dump_path, tmp_path, monkeypatch, capsys):
    out = tmp_path / "fits"
    real = Path.write_text

    def full_under_out(self, text, *args, **kwargs):
        if out in self.parents:
            real(self, text[:16], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_under_out)
    code = main(["fit", str(dump_path), "--steps", "0", "--method", "closed_form", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"{out}/" in err and "cannot write (No space left on device)" in err
    assert [p.name for p in out.rglob("*") if ".tmp" in p.name] == []
