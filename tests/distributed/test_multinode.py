"""Multi-node ``gradstat train``: ``--config-only --nnodes 2 --rdzv-endpoint HOST:PORT`` prints the command to run on
each node; two "nodes" on this machine (two torchrun launchers, c10d rendezvous on 127.0.0.1, collectives on the
loopback interface) run it and rank 0 writes the summary and figures of the 2-rank run."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gradstat.analysis.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def printed_command(out: Path, capsys, workload: str, nproc: int, nnodes: int, iterations: int) -> tuple[str, str]:
    """``gradstat train --config-only`` for ``nnodes`` nodes of ``nproc`` ranks on a free loopback endpoint, topk
    0.01: the command it prints to run on each node, and the endpoint."""
    endpoint = f"127.0.0.1:{free_port()}"
    args = [
        "train",
        "--workload",
        workload,
        "--nproc",
        str(nproc),
        "--nnodes",
        str(nnodes),
        "--rdzv-endpoint",
        endpoint,
    ]
    args += ["--compressor", "topk:ratio=0.01", "--iterations", str(iterations), "--interface", "lo", "--timeout", "60"]
    assert main([*args, "--out", str(out), "--config-only"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.startswith(f"run on each of the {nnodes} node"))
    return lines[lines.index(head) + 1], endpoint


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loopback interface is named lo on Linux")
def test_two_nodes_run_the_printed_command_and_rank_0_summarises(tmp_path, capsys):
    command, endpoint = printed_command(tmp_path / "r", capsys, "fc300", nproc=1, nnodes=2, iterations=3)
    assert f"--nnodes 2 --rdzv-backend c10d --rdzv-endpoint {endpoint} --nproc-per-node 1" in command
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(shlex.split(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    try:
        logs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-2000:] for log in logs)
    results = tmp_path / "r"
    table = pd.read_csv(results / "summary.csv")
    assert list(table["run"]) == ["allreduce", "topk:ratio=0.01+ef"]
    assert (table["ranks"] == 2).all() and (table["steps"] == 3).all() and (table["status"] == "ok").all()
    assert set(pd.read_csv(results / "steps.csv")["rank"]) == {0, 1}
    assert sum("summary and figures:" in log for log in logs) == 1  # rank 0 only
    for name in ("loss_vs_step.png", "loss_vs_bits.png", "summary.md"):
        assert (results / name).stat().st_size > 100


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--nnodes", "2"], "multi-node runs start with --config-only"),
        (["--nnodes", "0", "--config-only"], "--nnodes must be a positive integer"),
        (["--nnodes", "3", "--config-only"], "not divisible by 6 ranks (--nnodes 3 x --nproc 2)"),
        (["--rdzv-endpoint", "host", "--config-only"], "--rdzv-endpoint must be HOST:PORT"),
        (["--rdzv-endpoint", "h:99999", "--config-only"], "--rdzv-endpoint must be HOST:PORT"),
        (["--rdzv-endpoint", "127.0.0.1:29500"], "a rendezvous endpoint is for multi-node runs"),
    ],
)
def test_bad_multinode_options_are_refused(tmp_path, capsys, extra, message):
    args = ["train", "--workload", "fc300", "--compressor", "topk", "--out", str(tmp_path / "r"), *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loopback interface is named lo on Linux")
def test_a_diverged_run_under_torchrun_ends_the_launch_non_zero(tmp_path, capsys):
    """The printed command's launch (one node here) of runs that all diverge (lr = 10000): rank 0 says so first
    and exits 1, so torchrun fails the launch, as gradstat's own launcher does."""
    command, _ = printed_command(tmp_path / "r", capsys, "fc300:lr=10000", nproc=2, nnodes=1, iterations=6)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(shlex.split(command), env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode != 0, run.stdout[-2000:] + run.stderr[-2000:]
    said = [line for line in run.stdout.splitlines() if line.startswith("gradstat:")]
    assert said and said[0].startswith("gradstat: 2 of 2 runs diverged or stopped"), run.stdout[-2000:]
    assert (tmp_path / "r" / "summary.csv").is_file()
