"""Every command that takes ``--device`` runs on every device present (the suite's ``device`` fixture: CPU always,
CUDA when present, its CUDA runs marked ``cuda``); on a CUDA machine ``--device auto`` runs too. The commands reach
every study (fits, thresholds, replay, variance, feedback, variance-vs-gain, validation, report) on that device.

The list of commands comes from the click tree, so a command that gains ``--device`` without a run here fails."""

from __future__ import annotations

import click
import pytest
import torch
from test_every_command import RUNS  # the cheap arguments every command is run with

from gradstat.analysis.cli.main import main, walk

DEVICE_COMMANDS = sorted(
    path for path, cmd in walk() if not isinstance(cmd, click.Group) and any("--device" in p.opts for p in cmd.params)
)
EXTRA_RUNS: dict[tuple[str, ...], list[str]] = {
    ("experiment",): ["sidco-microbench", "--quick", "--out", "{tmp}/experiment"],  # the experiment run on CUDA
}
SLOW = {("demo",)}  # records, then the whole report (test_every_command runs it once too)
RUN_ELSEWHERE_ON_CPU = {("fit",), ("report",), ("experiment",)}
"""Commands of 10 s or more whose CPU run is already in the default suite where no CUDA device is present
(``--device auto`` is ``cpu`` there: test_every_command; sidco-microbench: test_sidco_microbench); where CUDA is
present their explicit ``--device cpu`` run is a case of its own and runs here."""


def _cases():
    for path in DEVICE_COMMANDS:
        yield pytest.param(path, marks=[pytest.mark.slow] if path in SLOW else [], id=" ".join(path))


def run(path: tuple[str, ...], device: str, tiny_dump, tmp_path, capsys) -> str:
    args = [a.format(dump=tiny_dump, tmp=tmp_path) for a in EXTRA_RUNS.get(path, RUNS[path])]
    options = {opt for p in dict(walk())[path].params for opt in p.opts}
    if "--out" in options and "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    if "--quiet" in options:
        args.append("--quiet")
    code = main([*path, *args, "--device", device])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip() and "Traceback" not in err
    return err


def test_every_command_taking_device_is_known():
    assert ("fit",) in DEVICE_COMMANDS and ("compress",) in DEVICE_COMMANDS
    missing = [" ".join(p) for p in DEVICE_COMMANDS if p not in RUNS and p not in EXTRA_RUNS]
    assert not missing, f"add a run of `gradstat {missing[0]}` (commands taking --device without one: {missing})"


@pytest.mark.parametrize("path", list(_cases()))
def test_command_runs_on_the_device(path, device, tiny_dump, tmp_path, capsys):
    if device.type == "cpu" and path in RUN_ELSEWHERE_ON_CPU and not torch.cuda.is_available():
        pytest.skip("the same CPU run is in test_every_command or test_sidco_microbench (no CUDA device here)")
    err = run(path, device.type, tiny_dump, tmp_path, capsys)
    if path == ("compress",) and device.type == "cuda":  # the tiny dump was recorded on the CPU
        assert "recorded on cpu and is replayed on cuda" in err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("path", list(_cases()))
def test_command_runs_with_device_auto_on_a_cuda_machine(path, tiny_dump, tmp_path, capsys):
    run(path, "auto", tiny_dump, tmp_path, capsys)
