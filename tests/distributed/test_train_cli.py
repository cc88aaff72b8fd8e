"""``gradstat train``: bad input is refused before anything is launched; one real launch (torchrun, 2 gloo ranks,
fc300) trains, records a 2-worker dump and writes the summary and figures."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gradstat.analysis.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def run(*args: object) -> int:
    return main([*map(str, args)])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--workload", "nope"], "unknown workload"),
        (["--nproc", "0"], "--nproc must be a positive integer"),
        (["--nproc", "3"], "not divisible by --nproc 3"),
        (["--iterations", "0"], "--iterations must be a positive integer"),
        (["--compressor", "topk:ratio=2"], "ratio must lie in (0, 1)"),
        (["--compressor", "nope"], "unknown compressor"),
        (["--compressor", "topk", "--feedback", "nope"], "unknown feedback"),
        (["--compressor", "topk", "--compressor", "qsgd", "--record-every", "2"], "exactly one --compressor"),
        (["--compressor", "ndqsg", "--exchange", "allreduce"], "side information"),
        (["--baselines", "fp8"], "unknown baseline"),
        (["--backend", "nccl"], "nccl needs 2 CUDA device"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    base = {"--workload": "fc300", "--nproc": "2", "--out": str(tmp_path / "o")}
    for i in range(0, len(args), 2):
        base.pop(args[i], None)
    flat = [x for kv in base.items() for x in kv]
    if "--backend" in args:
        pytest.importorskip("torch")
        import torch

        if torch.cuda.device_count() >= 2:
            pytest.skip("this machine has 2 GPUs: nccl is accepted")
    assert run("train", *flat, *args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gradstat: error:") and message in err and "\n" not in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_recording_into_a_directory_holding_other_files_is_refused(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("mine")
    code = run("train", "--workload", "fc300", "--compressor", "topk", "--record-every", "1", "--out", tmp_path / "d")
    assert code == 2 and "not empty" in capsys.readouterr().err
    assert (tmp_path / "d" / "keep.txt").read_text() == "mine"


def test_config_only_prints_the_torchrun_command(tmp_path, capsys):
    assert run("train", "--workload", "fc300", "--compressor", "qsgd", "--out", tmp_path / "r", "--config-only") == 0
    out = capsys.readouterr().out
    assert (
        "torch.distributed.run" in out
        and "--nproc-per-node 2" in out
        and "gradstat.analysis.training.distributed" in out
    )
    config = json.loads((tmp_path / "r" / "train_config.json").read_text())
    assert [r["label"] for r in config["runs"]] == ["allreduce", "qsgd"]


def test_train_launches_torchrun_records_two_workers_and_summarises(tmp_path, capsys, monkeypatch):
    """The launcher runs in this process (its ranks are processes of their own, as always): a launcher interpreter
    would only add its imports (about 3 s of CPU); ``python -m gradstat train`` is launched in test_train_safety."""
    dump = tmp_path / "D"
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # what the ranks inherit
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = ["train", "--workload", "fc300", "--nproc", "2"]
    args += ["--compressor", "topk:ratio=0.01", "--feedback", "ef", "--iterations", "4", "--record-every", "2"]
    args += ["--residual", "--baselines", "fp16", "--out", dump, "--timeout", "60"]
    assert run(*args) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    assert run("info", dump, "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["workers"] == 2 and summary["steps"] == [0, 2] and summary["extras"] == ["residual"]
    results = Path(f"{dump}.train")
    table = pd.read_csv(results / "summary.csv")
    assert list(table["run"]) == ["allreduce", "fp16", "topk:ratio=0.01+ef"]
    assert (table["ranks"] == 2).all() and (table["steps"] == 4).all()
    row = table.set_index("run")
    assert row.loc["fp16", "bytes_vs_allreduce"] == pytest.approx(0.5)
    assert row.loc["topk:ratio=0.01+ef", "bytes_vs_allreduce"] < 0.05
    steps = pd.read_csv(results / "steps.csv")
    assert len(steps) == 3 * 4 * 2
    blocks = pd.read_csv(results / "blocks.csv")  # per (step, rank, block): only our compressors' runs
    assert set(blocks["run"]) == {"topk:ratio=0.01+ef"}
    sums = blocks.groupby(["step", "rank"])[["bits", "wire_bytes"]].sum()
    logged = steps[steps["run"] == "topk:ratio=0.01+ef"].set_index(["step", "rank"])[["bits", "wire_bytes"]]
    assert sums.sort_index().equals(logged.sort_index())
    for name in ("loss_vs_step.png", "loss_vs_bits.png"):
        assert (results / name).stat().st_size > 1000
