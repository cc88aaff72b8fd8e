"""Import of .pt/.npz/.npy files and directories, export to .npz, and refusal of anything pickled."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from gradstat.analysis.dumps import DumpError, open_dump
from gradstat.analysis.dumps.convert import export_npz, import_dump


def _grads(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"fc.weight": torch.randn(3, 5, generator=g), "fc.bias": torch.randn(3, generator=g)}


def test_import_pt_dict_is_one_step(tmp_path):
    g = _grads(0)
    torch.save(g, tmp_path / "g.pt")
    d = open_dump(import_dump(tmp_path / "g.pt", tmp_path / "d"))
    assert d.steps == [0] and d.workers == 1 and d.params == ["fc.weight", "fc.bias"]
    assert torch.equal(d.read(0)["fc.weight"], g["fc.weight"])
    assert d.workload == "imported"


def test_import_pt_list_is_one_step_each(tmp_path):
    gs = [_grads(i) for i in range(3)]
    torch.save(gs, tmp_path / "g.pt")
    d = open_dump(import_dump(tmp_path / "g.pt", tmp_path / "d", dtype="bfloat16"))
    assert d.steps == [0, 1, 2]
    assert torch.equal(d.read(2)["fc.bias"], gs[2]["fc.bias"].to(torch.bfloat16))


def test_import_npz_and_npy(tmp_path):
    g = _grads(1)
    np.savez(tmp_path / "g.npz", **{k: v.numpy() for k, v in g.items()})
    d = open_dump(import_dump(tmp_path / "g.npz", tmp_path / "a"))
    assert torch.equal(d.read(0)["fc.bias"], g["fc.bias"])
    np.save(tmp_path / "v.npy", np.arange(6, dtype=np.float32))
    d = open_dump(import_dump(tmp_path / "v.npy", tmp_path / "b"))
    assert d.params == ["grad"] and torch.equal(d.flat(0), torch.arange(6, dtype=torch.float32))


def test_import_directory_in_natural_order(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in (10, 2, 1):
        np.save(src / f"step{i}.npy", np.full(4, float(i), dtype=np.float32))
    (src / "README").write_text("ignored: not a gradient file")
    d = open_dump(import_dump(src, tmp_path / "d"))
    assert d.steps == [0, 1, 2]
    assert [float(d.flat(s)[0]) for s in d.steps] == [1.0, 2.0, 10.0]


def test_export_then_import_restores_steps_and_workers(dump_path, tmp_path):
    d = open_dump(dump_path)
    out = export_npz(d, tmp_path / "e.npz", steps=[0, 10])
    with np.load(out) as z:
        assert sorted(z.files)[:2] == ["s0/w0/layer.bias", "s0/w0/layer.weight"] and len(z.files) == 2 * 2 * 2
    back = open_dump(import_dump(out, tmp_path / "back"))
    assert back.steps == [0, 10] and back.workers == 2
    for s in (0, 10):
        for w in (0, 1):
            assert torch.equal(back.flat(s, w), d.flat(s, w))


def test_export_never_overwrites(dump_path, tmp_path):
    target = tmp_path / "e.npz"
    target.write_bytes(b"precious")
    with pytest.raises(DumpError, match="exists; refusing to overwrite"):
        export_npz(open_dump(dump_path), target)
    assert target.read_bytes() == b"precious"


class Custom:
    def __init__(self):
        self.x = 1


def test_pickled_object_pt_is_refused_in_one_line(tmp_path):
    torch.save({"w": Custom()}, tmp_path / "evil.pt")
    with pytest.raises(DumpError) as info:
        import_dump(tmp_path / "evil.pt", tmp_path / "d")
    message = str(info.value)
    assert "evil.pt: refused" in message and "weights_only=True" in message and "\n" not in message
    assert not (tmp_path / "d").exists()


def test_pickled_payload_is_never_executed(tmp_path):
    """A .pt whose unpickling would run code: refused, and the code did not run."""
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"w": Exploit()}, tmp_path / "exploit.pt")
    with pytest.raises(DumpError, match="refused"):
        import_dump(tmp_path / "exploit.pt", tmp_path / "d")
    assert not marker.exists()


def test_object_npz_is_refused(tmp_path):
    np.savez(tmp_path / "o.npz", w=np.array([{"a": 1}], dtype=object))
    with pytest.raises(DumpError, match="o.npz: unreadable .npz.*no unpickling"):
        import_dump(tmp_path / "o.npz", tmp_path / "d")


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"w": torch.arange(3)}, "must be a floating-point tensor"),
        ({}, "must be a non-empty dict"),
        (collections.OrderedDict(w=torch.ones(2), v=torch.tensor([float("nan")])), "NaN/Inf"),
    ],
)
def test_bad_content_is_refused(tmp_path, obj, message):
    torch.save(obj, tmp_path / "g.pt")
    with pytest.raises(DumpError, match=message):
        import_dump(tmp_path / "g.pt", tmp_path / "d")


def test_inconsistent_steps_name_the_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a1.npy", np.zeros(4, dtype=np.float32))
    np.save(src / "a2.npy", np.zeros(5, dtype=np.float32))
    with pytest.raises(DumpError, match=r"a2.npy: .*shape \(5,\), the dump declares \(4,\)"):
        import_dump(src, tmp_path / "d")


def test_import_refuses_a_foreign_output_directory(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros(3, dtype=np.float32))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    with pytest.raises(DumpError, match="not a gradstat dump"):
        import_dump(tmp_path / "v.npy", out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
