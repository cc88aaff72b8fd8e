"""Reads are lazy: reading one parameter, worker or step touches only that data.

Shown two ways: (1) a corrupted tensor is never noticed by reads of other tensors (it is when read itself, so the
reads do check what they touch); (2) the bytes a read pulls from the file, counted by wrapping the
reader's file object, are exactly the requested tensors' bytes (plus the header, once per step).
"""

from __future__ import annotations

import io

import pytest
from _dumpkit import flip_byte, tensor_byte_range

import gradstat.analysis.dumps.reader as reader
from gradstat.analysis.dumps import DumpError, open_dump


def test_reading_one_parameter_does_not_touch_the_others(dump_path):
    f = dump_path / "step-00000005.safetensors"
    start, end = tensor_byte_range(f, "w0/layer.weight")
    flip_byte(f, (start + end) // 2)
    d = open_dump(dump_path)
    d.read(5, worker=0, params="layer.bias")  # other parameter, same worker
    d.read(5, worker=1)  # other worker, all parameters
    d.read_extra("residual", 5, worker=0)  # extra of the same worker
    d.flat(0), d.flat(10)  # other steps
    with pytest.raises(DumpError, match="checksum mismatch in tensor 'w0/layer.weight'"):
        d.read(5, worker=0, params="layer.weight")


def test_other_step_files_are_not_read(dump_path):
    f = dump_path / "step-00000010.safetensors"
    f.write_bytes(b"\0" * f.stat().st_size)  # same size, garbage content
    d = open_dump(dump_path)
    assert d.flat(5, 1).shape == (16,)
    with pytest.raises(DumpError, match="step-00000010"):
        d.flat(10, 1)


def test_bytes_read_are_exactly_the_requested_tensors(dump_path, monkeypatch):
    """Counting every byte the reader pulls from step files: the header once per step, then only the tensors."""
    counted: list[int] = []

    class CountingFile(io.FileIO):
        def read(self, n=-1):
            data = super().read(n)
            counted.append(len(data))
            return data

        def readinto(self, buf):
            n = super().readinto(buf)
            counted.append(n)
            return n

    monkeypatch.setattr(reader, "open", lambda file, mode="r": CountingFile(file, mode), raising=False)
    d = open_dump(dump_path)
    f = dump_path / "step-00000005.safetensors"
    header = 8 + int.from_bytes(f.read_bytes()[:8], "little")  # length prefix + JSON header
    d.read(5, worker=1, params="layer.bias")
    header_bytes = sum(counted[:-1])
    assert counted[-1] == 4 * 4 and header_bytes == header  # one float32 tensor of 4 elements + the header
    counted.clear()
    d.flat(5, worker=0)
    assert counted == [12 * 4, 4 * 4]  # the worker's two tensors only: not worker 1, not extras
    counted.clear()
    d.read_extra("residual", 5, worker=1, params="layer.weight")
    assert counted == [12 * 4]
