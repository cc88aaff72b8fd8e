"""Multi-node ``gradstat train``: ``--config-only --nnodes 2 --rdzv-endpoint HOST:PORT`` prints the command to run on
each node; two "nodes" on this machine (two torchrun launchers, c10d rendezvous on 127.0.0.1, collectives on the
loopback interface) run it and rank 0 writes the summary and figures of the 2-rank run.

The two nodes' launch also trains the unbiased quantizers with their papers' feedback (the default): one launch for
both checks, as a launch's interpreters cost far more than its runs (measured here: a launch of one run of one step
15 s of CPU, of four runs of 25 steps 17 s)."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gradstat.analysis.cli.main import main
from gradstat.analysis.training.feedback_check import error_factors
from gradstat.compressors import parse_feedback
from gradstat.theory.qcs import gamma

ROOT = Path(__file__).resolve().parents[2]


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the loopback interface is named lo on Linux")
TOPK = "topk:ratio=0.01"
QUANTIZERS = ("qsgd", "qcs", "ndqsg")
"""Unbiased quantizers: their papers' feedback is none (QSGD, NDQSG) or QCS's own (Remark 2), never plain ``ef``."""
ITERATIONS = 10
"""Steps of the two nodes' runs: fc300's loss falls from 2.30 to about 1.2 by step 9 with each of them."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def printed_command(
    out: Path, workload: str, nproc: int, nnodes: int, iterations: int, compressors: tuple[str, ...] = (TOPK,)
) -> tuple[str, str]:
    """``gradstat train --config-only`` for ``nnodes`` nodes of ``nproc`` ranks on a free loopback endpoint, each of
    ``compressors`` with its paper's feedback: the command it prints to run on each node, and the endpoint."""
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
    for spec in compressors:
        args += ["--compressor", spec]
    args += ["--iterations", str(iterations), "--interface", "lo", "--timeout", "60"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*args, "--out", str(out), "--config-only"]) == 0
    lines = printed.getvalue().splitlines()
    head = next(line for line in lines if line.startswith(f"run on each of the {nnodes} node"))
    return lines[lines.index(head) + 1], endpoint


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """The printed command of a 2-node run (one rank each) of the quantizers and Top-k, run on two local "nodes":
    the command, its endpoint, each node's exit status and output, and the results folder."""
    results = tmp_path_factory.mktemp("two-nodes") / "r"
    command, endpoint = printed_command(results, "fc300", 1, 2, ITERATIONS, (*QUANTIZERS, TOPK))
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
    return command, endpoint, [node.returncode for node in nodes], logs, results


@LINUX
def test_two_nodes_run_the_printed_command_and_rank_0_summarises(two_nodes):
    command, endpoint, codes, logs, results = two_nodes
    assert f"--nnodes 2 --rdzv-backend c10d --rdzv-endpoint {endpoint} --nproc-per-node 1" in command
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    table = pd.read_csv(results / "summary.csv")
    runs = list(table["run"])
    assert [run.split("+")[0] for run in runs] == ["allreduce", *QUANTIZERS, TOPK] and runs[-1] == f"{TOPK}+ef"
    assert (table["ranks"] == 2).all() and (table["steps"] == ITERATIONS).all() and (table["status"] == "ok").all()
    assert set(pd.read_csv(results / "steps.csv")["rank"]) == {0, 1}
    assert sum("summary and figures:" in log for log in logs) == 1  # rank 0 only
    for name in ("loss_vs_step.png", "loss_vs_bits.png", "summary.md"):
        assert (results / name).stat().st_size > 100


@LINUX
def test_unbiased_quantizers_train_with_their_papers_feedback(two_nodes):
    """fc300 (lenet's factors and refusals: test_feedback_defaults; its training here, in the two nodes' runs)."""
    assert min(error_factors("fc300", 2, list(QUANTIZERS), layer=False).values()) > 1  # ef would be refused
    *_, codes, logs, results = two_nodes
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    table = pd.read_csv(results / "summary.csv").set_index("run")
    beta = 1 / (gamma(256, 64, 4) + 1)
    assert list(table.index[:2]) == ["allreduce", "qsgd"] and table.index[2].startswith("qcs+qcs:beta=")
    assert table.index[3] == "ndqsg"
    assert parse_feedback(table.index[2].split("+")[1]).compensation == pytest.approx(beta, rel=1e-5)
    assert (table["status"] == "ok").all() and (table["steps"] == ITERATIONS).all()
    assert (table["final_loss_tail"] < table["first_loss"]).all()


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


@LINUX
def test_a_diverged_run_under_torchrun_ends_the_launch_non_zero(tmp_path):
    """The printed command's launch (one node here) of runs that all diverge (lr = 10000): rank 0 says so first
    and exits 1, so torchrun fails the launch, as gradstat's own launcher does."""
    command, _ = printed_command(tmp_path / "r", "fc300:lr=10000", nproc=2, nnodes=1, iterations=6)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(shlex.split(command), env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode != 0, run.stdout[-2000:] + run.stderr[-2000:]
    said = [line for line in run.stdout.splitlines() if line.startswith("gradstat:")]
    assert said and said[0].startswith("gradstat: 2 of 2 runs diverged or stopped"), run.stdout[-2000:]
    assert (tmp_path / "r" / "summary.csv").is_file()
