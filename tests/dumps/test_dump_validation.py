"""Every validation error: each is a DumpError (a ValueError) naming the file and the problem."""

from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from _dumpkit import PARAMS, flip_byte, make_grads, tensor_byte_range

from gradstat.analysis.dumps import DumpError, DumpWriter, open_dump
from gradstat.analysis.dumps.format import FORMAT_VERSION


def _edit_manifest(path, change):
    m = json.loads((path / "manifest.json").read_text())
    change(m)
    (path / "manifest.json").write_text(json.dumps(m))


def test_dump_error_is_a_value_error():
    assert issubclass(DumpError, ValueError)


def test_missing_directory(tmp_path):
    with pytest.raises(DumpError, match="not a directory"):
        open_dump(tmp_path / "nope")


def test_directory_without_manifest(tmp_path):
    with pytest.raises(DumpError, match=r"manifest\.json: missing"):
        open_dump(tmp_path)


def test_manifest_not_json(dump_path):
    (dump_path / "manifest.json").write_text("{ not json")
    with pytest.raises(DumpError, match=r"manifest\.json: not valid JSON"):
        open_dump(dump_path)


def test_newer_format_version_is_refused_clearly(dump_path):
    _edit_manifest(dump_path, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(DumpError, match=rf"format version {FORMAT_VERSION + 1}.*upgrade gradstat"):
        open_dump(dump_path)


def test_manifest_schema_errors_name_the_field(dump_path):
    _edit_manifest(dump_path, lambda m: m.update(workers="two"))
    with pytest.raises(DumpError, match=r"manifest\.json: field 'workers' must be of type int"):
        open_dump(dump_path)


def test_missing_step_file(dump_path):
    (dump_path / "step-00000005.safetensors").unlink()
    with pytest.raises(DumpError, match=r"step-00000005\.safetensors: missing"):
        open_dump(dump_path)


def test_extra_file(dump_path):
    (dump_path / "notes.txt").write_text("hello")
    with pytest.raises(DumpError, match=r"notes\.txt: unexpected file"):
        open_dump(dump_path)


def test_unlisted_step_file_before_the_last_is_extra(dump_path):
    (dump_path / "step-00000003.safetensors").write_bytes(b"x")
    with pytest.raises(DumpError, match=r"step-00000003\.safetensors: unexpected file"):
        open_dump(dump_path)


def test_truncated_file(dump_path):
    f = dump_path / "step-00000010.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(DumpError, match=r"step-00000010\.safetensors: truncated"):
        open_dump(dump_path)


def test_corrupt_tensor_fails_its_read_and_verify(dump_path):
    f = dump_path / "step-00000005.safetensors"
    start, _ = tensor_byte_range(f, "w1/layer.weight")
    flip_byte(f, start + 3)
    d = open_dump(dump_path)  # same size: opening cannot tell
    with pytest.raises(DumpError, match=r"step-00000005\.safetensors: checksum mismatch in tensor 'w1/layer.weight'"):
        d.read(5, 1)
    with pytest.raises(DumpError, match=r"step-00000005\.safetensors: checksum mismatch"):
        open_dump(dump_path).verify()


def test_corrupt_header_is_unreadable(dump_path):
    f = dump_path / "step-00000000.safetensors"
    flip_byte(f, 12)  # inside the JSON header
    d = open_dump(dump_path)
    with pytest.raises(DumpError, match=r"step-00000000\.safetensors"):
        d.read(0)


def test_verify_catches_a_changed_file_whose_tensors_still_match(dump_path):
    """The whole-file sha256 in the manifest covers bytes no tensor checksum does (the header)."""
    _edit_manifest(dump_path, lambda m: m["steps"][0].update(sha256="sha256:" + "0" * 64))
    open_dump(dump_path).read(0)  # tensors are fine
    with pytest.raises(DumpError, match=r"step-00000000\.safetensors: checksum mismatch"):
        open_dump(dump_path).verify()


def test_wrong_shape(dump_path):
    _edit_manifest(dump_path, lambda m: m["params"][1].update(shape=[5]))
    with pytest.raises(
        DumpError,
        match=r"step-00000000\.safetensors: tensor 'w0/layer.bias' has shape \(4,\), manifest\.json declares \(5,\)",
    ):
        open_dump(dump_path).read(0)


def test_wrong_dtype(dump_path):
    def to_f16(m):
        m["dtype"] = "float16"
        for p in m["params"]:
            p["dtype"] = "float16"

    _edit_manifest(dump_path, to_f16)
    with pytest.raises(DumpError, match=r"has dtype F32, manifest\.json declares F16"):
        open_dump(dump_path).read(0)


def test_missing_tensor_in_file(dump_path):
    _edit_manifest(dump_path, lambda m: m.update(workers=3))
    with pytest.raises(DumpError, match=r"tensors do not match manifest\.json: missing \['w2/"):
        open_dump(dump_path).read(0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: d.read(7), r"step 7 was not recorded; recorded steps: \[0, 5, 10\]"),
        (lambda d: d.read(0, worker=2), r"worker 2 out of range"),
        (lambda d: d.read(0, params="nope"), r"unknown parameter\(s\) \['nope'\]"),
        (lambda d: d.read_extra("momentum", 0), r"no extra 'momentum'"),
    ],
)
def test_bad_requests(dump_path, call, message):
    with pytest.raises(DumpError, match=message):
        call(open_dump(dump_path))


def test_writer_refuses_a_directory_holding_something_else(tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(DumpError, match="not empty and is not a gradstat dump"):
        DumpWriter(tmp_path, workload="toy", params=PARAMS)
    assert sorted(os.listdir(tmp_path)) == ["mine.txt"] and (tmp_path / "mine.txt").read_text() == "precious"


def test_writer_refuses_an_existing_dump(dump_path):
    before = (dump_path / "manifest.json").read_bytes()
    with pytest.raises(DumpError, match="already holds a gradient dump"):
        DumpWriter(dump_path, workload="toy", params=PARAMS)
    assert (dump_path / "manifest.json").read_bytes() == before


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"layer.weight": torch.full((3, 4), float("nan")), "layer.bias": torch.zeros(4)}, "NaN/Inf"),
        (
            {"layer.weight": torch.zeros(4, 3), "layer.bias": torch.zeros(4)},
            r"shape \(4, 3\), the dump declares \(3, 4\)",
        ),
        ({"layer.weight": torch.zeros(3, 4)}, r"missing parameters \['layer.bias'\]"),
        ({"layer.weight": torch.zeros(3, 4, dtype=torch.int64), "layer.bias": torch.zeros(4)}, "floating-point"),
    ],
)
def test_writer_rejects_bad_gradients(tmp_path, bad, message):
    w = DumpWriter(tmp_path / "d", workload="toy", params=PARAMS)
    with pytest.raises((ValueError, TypeError), match=message):
        w.write_step(0, [bad])
    assert open_dump(tmp_path / "d").steps == []


def test_float16_overflow_is_rejected(tmp_path):
    w = DumpWriter(tmp_path / "d", workload="toy", params=PARAMS, dtype="float16")
    big = {"layer.weight": torch.full((3, 4), 1e6), "layer.bias": torch.zeros(4)}
    with pytest.raises(ValueError, match="NaN/Inf values \\(after conversion to float16\\)"):
        w.write_step(0, [big])


def test_steps_must_increase(tmp_path):
    w = DumpWriter(tmp_path / "d", workload="toy", params=PARAMS, workers=2)
    w.write_step(3, make_grads(3))
    with pytest.raises(DumpError, match="step 3 is not after the last recorded step 3"):
        w.write_step(3, make_grads(3))


def test_unknown_storage_dtype(tmp_path):
    with pytest.raises(
        ValueError, match=r"dtype 'float64' is not a storage dtype; accepted: float32, float16, bfloat16"
    ):
        DumpWriter(tmp_path / "d", workload="toy", params=PARAMS, dtype="float64")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("fail_on", ["step", "manifest"])
def test_full_disk_leaves_the_dump_valid(dump_path, monkeypatch, fail_on):
    """ENOSPC while writing the step file or the manifest: the error surfaces as OSError, the dump still opens
    with its previous steps, no temporary file is left, and appending works once space is back."""
    import gradstat.analysis.dumps.atomic as atomic

    real_open = open

    def failing_open(file, mode="r", *args, **kwargs):
        target = "manifest.json" if fail_on == "manifest" else "step-00000015"
        if "w" in mode and target in str(file):
            handle = real_open(file, mode, *args, **kwargs)
            handle.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(file, mode, *args, **kwargs)

    w = DumpWriter.append(dump_path)
    monkeypatch.setattr(atomic, "open", failing_open, raising=False)
    with pytest.raises(OSError, match="No space left"):
        w.write_step(15, make_grads(15), {"residual": make_grads(16)})
    monkeypatch.undo()
    d = open_dump(dump_path)
    assert d.steps == [0, 5, 10] and d.uncommitted == []
    assert not [f for f in os.listdir(dump_path) if f.endswith(".tmp")]
    d.verify()
    w = DumpWriter.append(dump_path)
    w.write_step(15, make_grads(15), {"residual": make_grads(16)})
    assert open_dump(dump_path).steps == [0, 5, 10, 15]
