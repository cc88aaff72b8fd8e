"""Format round trip: what is written is read back, for every storage dtype, on every device."""

from __future__ import annotations

import json

import pytest
import torch
from _dumpkit import PARAMS, write_dump
from safetensors import safe_open

from gradstat.analysis.dumps import STORAGE_DTYPES, open_dump
from gradstat.analysis.dumps.format import FORMAT_VERSION


@pytest.mark.parametrize("dtype", list(STORAGE_DTYPES))
def test_round_trip_every_dtype(tmp_path, dtype, device):
    written = write_dump(tmp_path / "d", dtype=dtype)
    d = open_dump(tmp_path / "d")
    torch_dtype = STORAGE_DTYPES[dtype]
    assert d.steps == [0, 5, 10] and d.workers == 2 and d.dtype == torch_dtype
    for step, (grads, extras) in written.items():
        for w in range(2):
            got = d.read(step, w, device=device)
            assert list(got) == [n for n, _ in PARAMS]
            for name, t in got.items():
                assert t.dtype == torch_dtype and t.device.type == device.type
                # exact: the stored value is the written one rounded once to the storage dtype
                assert torch.equal(t.cpu(), grads[w][name].to(torch_dtype))
            res = d.read_extra("residual", step, w, params="layer.bias")
            assert torch.equal(res["layer.bias"], extras["residual"][w]["layer.bias"].to(torch_dtype))
    d.verify()


def test_description_matches_what_was_written(dump_path):
    d = open_dump(dump_path)
    assert d.workload == "toy"
    assert d.params == ["layer.weight", "layer.bias"]
    assert d.shapes == {"layer.weight": (3, 4), "layer.bias": (4,)}
    assert d.numel == 16
    assert d.extras == ["residual"]
    m = d.manifest
    assert m["format_version"] == FORMAT_VERSION and m["every"] == 5
    assert m["optimizer"] == {"name": "sgd", "lr": 0.1} and m["seeds"] == {"seed": 3}
    assert m["metadata"] == {"note": "test"}
    assert {"torch", "safetensors", "python", "numpy", "gradstat"} <= set(m["versions"])
    assert all(e["sha256"].startswith("sha256:") and e["bytes"] > 0 for e in m["steps"])


def test_flat_is_model_order_concatenation(dump_path):
    d = open_dump(dump_path)
    parts = d.read(5, 1)
    flat = d.flat(5, 1, dtype=torch.float64)
    assert flat.shape == (16,) and flat.dtype == torch.float64
    assert torch.equal(flat, torch.cat([parts["layer.weight"].reshape(-1), parts["layer.bias"]]).double())
    assert torch.equal(
        d.flat_extra("residual", 5, 1), torch.cat([t.reshape(-1) for t in d.read_extra("residual", 5, 1).values()])
    )


def test_read_selects_parameters(dump_path):
    d = open_dump(dump_path)
    assert list(d.read(0, 0, params="layer.bias")) == ["layer.bias"]
    assert list(d.read(0, 0, params=["layer.bias", "layer.weight"])) == ["layer.bias", "layer.weight"]


def test_step_files_are_standard_safetensors(dump_path):
    """Any safetensors reader opens a step file; keys follow the documented naming."""
    d = open_dump(dump_path)
    with safe_open(d.file(5), framework="pt") as f:
        keys = set(f.keys())
        assert "w1/layer.weight" in keys and "x/residual/w0/layer.bias" in keys and len(keys) == 8
        assert torch.equal(f.get_tensor("w1/layer.weight"), d.read(5, 1)["layer.weight"])
    json.loads((dump_path / "manifest.json").read_text())


def test_tensors_sharing_memory_are_written(tmp_path):
    """The same tensor for two workers, and views of one flat buffer (as the recorder's extras are)."""
    from gradstat.analysis.dumps import DumpWriter

    flat = torch.arange(16, dtype=torch.float32)
    views = {"layer.weight": flat[:12].view(3, 4), "layer.bias": flat[12:]}
    w = DumpWriter(tmp_path / "d", workload="toy", params=PARAMS, workers=2)
    w.write_step(0, [views, views])
    d = open_dump(tmp_path / "d")
    assert torch.equal(d.flat(0, 0), flat) and torch.equal(d.flat(0, 1), flat)
