"""``gradstat compress`` replays on the device the dump was recorded on unless ``--device`` names one, and warns
where the replay's device differs from the recording's (no bit-exact replay there)."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

from gradstat.analysis.cli.main import main
from gradstat.analysis.dumps import open_dump
from gradstat.analysis.dumps.format import RECORDED_DEVICE_KEY
from gradstat.analysis.studies import replay as replay_study
from gradstat.analysis.studies.replay_device import recorded_device, replay_device

HAS_CUDA = torch.cuda.is_available()
WARNING = "gradstat: warning: the dump was recorded on {recorded} and is replayed on {used}"


def dump_recorded_on(tiny_dump, tmp_path, device: str | None):
    """A copy of the tiny dump whose manifest says it was recorded on ``device`` (None: says nothing)."""
    path = tmp_path / "dump"
    shutil.copytree(tiny_dump, path)
    manifest = json.loads((path / "manifest.json").read_text())
    if device is None:
        manifest["metadata"].pop(RECORDED_DEVICE_KEY, None)
    else:
        manifest["metadata"][RECORDED_DEVICE_KEY] = device
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.fixture
def replayed_on(monkeypatch):
    """The devices the whole-model replay was run on, one per ``gradstat compress`` call."""
    seen: list[torch.device] = []
    honest = replay_study.run

    def run(*args, **kwargs):
        seen.append(torch.device(args[6]))  # (dump, out, pairs, steps, workers, seeds, device, progress)
        return honest(*args, **kwargs)

    monkeypatch.setattr(replay_study, "run", run)
    return seen


def compress(path, tmp_path, *extra: str) -> list[str]:
    args = ["compress", str(path), "--steps", "0-1", "--compressor", "topk:ratio=0.1", "--quiet"]
    return [*args, "--out", str(tmp_path / "out"), *extra]


def test_the_recorder_writes_the_device_it_trained_on(tiny_dump):
    assert open_dump(tiny_dump).manifest["metadata"][RECORDED_DEVICE_KEY] == "cpu"
    assert recorded_device(open_dump(tiny_dump)) == "cpu"


def test_a_dump_recorded_on_cpu_replays_on_cpu_without_a_warning(tiny_dump, tmp_path, replayed_on, capsys):
    """Even where CUDA is visible (the online/offline parity check depends on it)."""
    assert main(compress(dump_recorded_on(tiny_dump, tmp_path, "cpu"), tmp_path)) == 0
    assert replayed_on == [torch.device("cpu")]
    assert "warning" not in capsys.readouterr().err


@pytest.mark.skipif(HAS_CUDA, reason="the case of a machine without CUDA")
def test_a_dump_recorded_on_cuda_replays_on_cpu_here_and_warns(tiny_dump, tmp_path, replayed_on, capsys):
    assert main(compress(dump_recorded_on(tiny_dump, tmp_path, "cuda"), tmp_path)) == 0
    assert replayed_on == [torch.device("cpu")]
    err = capsys.readouterr().err
    assert WARNING.format(recorded="cuda", used="cpu") + ", as gradstat has no cuda device here" in err
    assert "not bit-exact" in err and "--device cuda replays where it was recorded" in err


@pytest.mark.cuda
def test_a_dump_recorded_on_cuda_replays_on_cuda_without_a_warning(tiny_dump, tmp_path, replayed_on, capsys):
    assert main(compress(dump_recorded_on(tiny_dump, tmp_path, "cuda"), tmp_path)) == 0
    assert [d.type for d in replayed_on] == ["cuda"]
    assert "warning" not in capsys.readouterr().err


def test_device_named_on_the_command_line_wins_and_warns_when_it_differs(tiny_dump, tmp_path, replayed_on, capsys):
    assert main(compress(dump_recorded_on(tiny_dump, tmp_path, "cuda"), tmp_path, "--device", "cpu")) == 0
    assert replayed_on == [torch.device("cpu")]
    assert WARNING.format(recorded="cuda", used="cpu") + ", as --device cpu asks" in capsys.readouterr().err


def test_device_named_on_the_command_line_as_recorded_gives_no_warning(tiny_dump, tmp_path, replayed_on, capsys):
    assert main(compress(dump_recorded_on(tiny_dump, tmp_path, "cpu"), tmp_path, "--device", "cpu")) == 0
    assert replayed_on == [torch.device("cpu")]
    assert "warning" not in capsys.readouterr().err


@pytest.mark.cuda
def test_cuda_named_for_a_dump_recorded_on_cpu_warns(tiny_dump, tmp_path, replayed_on, capsys):
    assert main(compress(dump_recorded_on(tiny_dump, tmp_path, "cpu"), tmp_path, "--device", "auto")) == 0
    assert [d.type for d in replayed_on] == ["cuda"]
    assert WARNING.format(recorded="cpu", used="cuda") + ", as --device auto asks" in capsys.readouterr().err


def test_a_dump_that_does_not_say_replays_where_auto_points(tiny_dump, tmp_path):
    dump = open_dump(dump_recorded_on(tiny_dump, tmp_path, None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replay_device(dump, None).type == ("cuda" if HAS_CUDA else "cpu")


def test_a_recorded_device_that_is_no_device_is_a_clear_error(tiny_dump, tmp_path, capsys):
    path = dump_recorded_on(tiny_dump, tmp_path, "gpu0")
    assert main(compress(path, tmp_path)) == 2
    err = capsys.readouterr().err
    assert f"{path}: metadata 'device' must name a device type such as 'cpu' or 'cuda', got 'gpu0'" in err
