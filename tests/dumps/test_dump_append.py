"""Reopening a dump appends; leftovers of an interrupted write are ignored by readers and cleaned on append."""

from __future__ import annotations

import pytest
from _dumpkit import make_grads, write_dump

from gradstat.analysis.dumps import DumpError, DumpWriter, open_dump


def test_append_adds_steps_and_keeps_old_ones(dump_path):
    before = open_dump(dump_path).flat(5, 1)
    w = DumpWriter.append(dump_path)
    assert w.steps == [0, 5, 10]
    w.write_step(15, make_grads(15), {"residual": make_grads(16)})
    d = open_dump(dump_path)
    assert d.steps == [0, 5, 10, 15]
    assert d.flat(5, 1).equal(before)
    d.verify()


def test_append_rejects_going_back(dump_path):
    w = DumpWriter.append(dump_path)
    with pytest.raises(DumpError, match="not after the last recorded step 10"):
        w.write_step(7, make_grads(7), {"residual": make_grads(8)})


def test_leftovers_are_ignored_then_cleaned(dump_path):
    (dump_path / ".step-00000015.safetensors.123.tmp").write_bytes(b"partial")
    (dump_path / "step-00000015.safetensors").write_bytes(b"renamed but never committed")
    d = open_dump(dump_path)
    assert d.steps == [0, 5, 10] and d.uncommitted == ["step-00000015.safetensors"]
    d.verify()
    w = DumpWriter.append(dump_path)
    w.write_step(15, make_grads(15), {"residual": make_grads(16)})
    d = open_dump(dump_path)
    assert d.steps == [0, 5, 10, 15] and d.uncommitted == []
    d.verify()


def test_append_to_something_that_is_not_a_dump(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(DumpError, match="manifest.json: missing"):
        DumpWriter.append(tmp_path)
    assert (tmp_path / "a.txt").read_text() == "x"


def test_every_storage_dtype_appends(tmp_path):
    for dtype in ("float16", "bfloat16"):
        write_dump(tmp_path / dtype, steps=(0,), dtype=dtype)
        DumpWriter.append(tmp_path / dtype).write_step(1, make_grads(1), {"residual": make_grads(2)})
        assert open_dump(tmp_path / dtype).steps == [0, 1]
