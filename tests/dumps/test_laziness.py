"""Reads are lazy: reading one parameter, worker or step touches only that data.

Shown two ways: (1) a corrupted tensor is never noticed by reads of other tensors (it is when read itself, so the
reads do check what they touch); (2) the bytes a read pulls through the memory map, counted with a wrapped
safetensors handle, are exactly the requested tensor's bytes.
"""
from __future__ import annotations

import pytest
import torch

import analysis.dumps.reader as reader
from analysis.dumps import DumpError, open_dump

from _dumpkit import flip_byte, tensor_byte_range


def test_reading_one_parameter_does_not_touch_the_others(dump_path):
    f = dump_path / "step-00000005.safetensors"
    start, end = tensor_byte_range(f, "w0/layer.weight")
    flip_byte(f, (start + end) // 2)
    d = open_dump(dump_path)
    d.read(5, worker=0, params="layer.bias")       # other parameter, same worker
    d.read(5, worker=1)                              # other worker, all parameters
    d.read_extra("residual", 5, worker=0)            # extra of the same worker
    d.flat(0), d.flat(10)                            # other steps
    with pytest.raises(DumpError, match="checksum mismatch in tensor 'w0/layer.weight'"):
        d.read(5, worker=0, params="layer.weight")


def test_other_step_files_are_not_read(dump_path):
    f = dump_path / "step-00000010.safetensors"
    f.write_bytes(b"\0" * f.stat().st_size)         # same size, garbage content
    d = open_dump(dump_path)
    assert d.flat(5, 1).shape == (16,)
    with pytest.raises(DumpError, match="step-00000010"):
        d.flat(10, 1)


def test_bytes_read_are_exactly_the_requested_tensor(dump_path, monkeypatch):
    counted: list[int] = []
    real_safe_open = reader.safe_open

    class Counting:
        def __init__(self, *args, **kwargs):
            self._f = real_safe_open(*args, **kwargs)

        def __enter__(self):
            self._inner = self._f.__enter__()
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

        def get_tensor(self, key):
            t = self._inner.get_tensor(key)
            counted.append(t.numel() * t.element_size())
            return t

        def __getattr__(self, name):
            return getattr(self._inner, name)

    monkeypatch.setattr(reader, "safe_open", Counting)
    d = open_dump(dump_path)
    d.read(5, worker=1, params="layer.bias")
    assert counted == [4 * 4]                         # one float32 tensor of 4 elements, nothing else
    counted.clear()
    d.flat(5, worker=0)
    assert counted == [12 * 4, 4 * 4]                 # the worker's two tensors only, not worker 1, not extras
