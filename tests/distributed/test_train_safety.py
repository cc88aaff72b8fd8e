"""``gradstat train`` on one machine listens on nothing but loopback, keeps every run's result when one diverges,
never replaces a user's files, and its ranks end when the launcher is killed."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from gradstat.analysis.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc/*/stat's parent ids)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    out, frontier = [pid], [pid]
    while frontier:
        frontier = [c for c, p in parents.items() if p in frontier]
        out += frontier
    return out


def socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return inodes


def listening_addresses(inodes: set[str]) -> set[str]:
    """The local addresses (``ip:port``) of TCP sockets in LISTEN state whose inode is in ``inodes``."""
    found = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN or fields[9] not in inodes:
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc prints each 32-bit word of the address in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            found.add(f"{ipaddress.ip_address(raw)}:{int(hex_port, 16)}")
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rpartition(":")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@pytest.fixture(scope="module")
def diverging(tmp_path_factory):
    """One launch whose every run diverges (lr=10000), its listening sockets sampled every 50 ms while it ran."""
    out = tmp_path_factory.mktemp("train") / "r"
    cmd = [sys.executable, "-m", "gradstat", "train", "--workload", "fc300:lr=10000", "--nproc", "2"]
    cmd += ["--compressor", "topk:ratio=0.01", "--iterations", "6", "--out", str(out), "--timeout", "60"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()

    def sample() -> None:
        while proc.poll() is None:
            seen.update(listening_addresses(socket_inodes(descendants(proc.pid))))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    stdout, stderr = proc.communicate(timeout=300)
    sampler.join()
    return proc.returncode, stdout, stderr, out, seen


def test_a_single_node_run_listens_on_loopback_only(diverging):
    code, _, stderr, _, seen = diverging
    assert code == 1, stderr[-2000:]  # every run diverged
    assert seen, "the sampler saw no listening socket at all (the gloo pairs listen while the ranks run)"
    assert [a for a in seen if not is_loopback(a)] == []


def test_the_socket_lister_sees_what_torchruns_store_would_open():
    """The check above can fail: torch's TCPStore (torchrun's rendezvous) listens on every interface even when
    given 127.0.0.1, and the lister reports that as a non-loopback address."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))
    seen = listening_addresses(socket_inodes([os.getpid()]))
    assert any(a.endswith(f":{store.port}") and not is_loopback(a) for a in seen), seen
    del store


def test_a_diverging_all_reduce_baseline_is_reported_and_the_other_runs_kept(diverging):
    code, stdout, stderr, out, _ = diverging
    assert code == 1, stderr[-2000:]
    first = stdout.splitlines()[0]  # the divergence is the first thing said
    assert first.startswith("gradstat: 2 of 2 runs diverged or stopped: allreduce: stopped at step")
    assert "topk:ratio=0.01+ef: stopped at step" in first
    table = pd.read_csv(out / "summary.csv").set_index("run")
    assert list(table.index) == ["allreduce", "topk:ratio=0.01+ef"]
    assert table.loc["allreduce", "status"].startswith("stopped at step")
    assert "NaN/Inf" in table.loc["allreduce", "status"] and "\n" not in table.loc["allreduce", "status"]
    steps = pd.read_csv(out / "steps.csv")
    assert set(steps["run"]) == {"allreduce", "topk:ratio=0.01+ef"} and set(steps["rank"]) == {0, 1}
    assert (steps[steps["run"] == "topk:ratio=0.01+ef"]["step"] >= 1).any()
    assert "allreduce" in stdout


def test_the_out_folder_of_a_launch_is_recorded_as_gradstats_result(diverging):
    *_, out, _ = diverging
    manifest = json.loads((out / ".gradstat-out.json").read_text())
    assert manifest["command"] == "train" and "summary.csv" in manifest["files"]


def run(*args: object) -> int:
    return main([*map(str, args)])


@pytest.mark.parametrize("record", [False, True])
def test_a_folder_holding_a_users_file_is_refused_untouched(tmp_path, capsys, record):
    target = tmp_path / ("D.train" if record else "u")
    target.mkdir()
    (target / "summary.csv").write_text("mine")
    args = ["--record-every", "1", "--out", tmp_path / "D"] if record else ["--out", target]
    code = run("train", "--workload", "fc300", "--compressor", "topk", "--config-only", *args)
    assert code == 2 and "gradstat did not write (summary.csv)" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["summary.csv"] and (target / "summary.csv").read_text() == "mine"
    assert not (tmp_path / "D").exists()


def test_gradstats_own_earlier_result_is_replaced(tmp_path, capsys):
    for spec in ("topk", "qsgd"):
        assert run("train", "--workload", "fc300", "--compressor", spec, "--out", tmp_path / "r", "--config-only") == 0
    assert "replacing the earlier result of `gradstat train`" in capsys.readouterr().out
    config = json.loads((tmp_path / "r" / "train_config.json").read_text())
    assert [r["label"] for r in config["runs"]] == ["allreduce", "qsgd"]


def test_the_interface_is_written_for_the_ranks_and_checked(tmp_path, capsys):
    args = ["train", "--workload", "fc300", "--compressor", "topk", "--config-only"]
    assert run(*args, "--out", tmp_path / "a", "--interface", "eth7") == 0
    assert json.loads((tmp_path / "a" / "train_config.json").read_text())["interface"] == "eth7"
    assert "--rdzv-endpoint HOST:PORT" in capsys.readouterr().out
    assert run(*args, "--out", tmp_path / "b", "--interface", "a b") == 2
    assert "--interface must name a network interface" in capsys.readouterr().err


def test_the_ranks_end_within_seconds_when_the_launcher_is_killed(tmp_path):
    cmd = [sys.executable, "-m", "gradstat", "train", "--workload", "fc300", "--nproc", "2"]
    cmd += ["--iterations", "100000", "--out", str(tmp_path / "r")]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "r" / "steps.rank-1.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the ranks have joined and started training
        ranks = descendants(launcher.pid)[1:]
        assert len(ranks) == 2, "the launcher did not start its two ranks"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        end = time.monotonic() + 10
        while (alive := [p for p in ranks if not _gone(p)]) and time.monotonic() < end:
            time.sleep(0.1)
        assert alive == [], f"ranks {alive} still run 10 s after their launcher was killed"
    finally:
        launcher.kill()
        for p in ranks:
            if not _gone(p):
                os.kill(p, signal.SIGKILL)


def _gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by whoever adopted it counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_launch_past_its_wall_clock_limit_is_stopped_with_a_clear_error(tmp_path):
    from gradstat.analysis.training.distributed_launch import TrainingFailed, build_config, train

    config = build_config("fc300", 2, ["topk"], iterations=100000, out=tmp_path / "r")
    start = time.monotonic()
    # half a second: the ranks are still importing (the limit, not what the ranks reached, is what is checked)
    with pytest.raises(TrainingFailed, match=r"did not finish within 0.5 s; every rank was stopped"):
        train(config, 2, wall_timeout_s=0.5)
    assert time.monotonic() - start < 30


def test_a_rank_that_dies_stops_the_others_and_the_launch_fails_naming_it(tmp_path):
    cmd = [sys.executable, "-m", "gradstat", "train", "--workload", "fc300", "--nproc", "2"]
    cmd += ["--iterations", "100000", "--out", str(tmp_path / "r")]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "r" / "steps.rank-1.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = descendants(launcher.pid)[1:]
        assert len(ranks) == 2, "the launcher did not start its two ranks"
        os.kill(ranks[1], signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=30)  # the other rank would wait in gloo for --timeout (300 s)
        assert launcher.returncode == 2 and "distributed training failed: rank 1 exited with status -9" in stderr, (
            stderr[-3000:]
        )
        assert _gone(ranks[0])
    finally:
        launcher.kill()
        for p in ranks:
            if not _gone(p):
                os.kill(p, signal.SIGKILL)


def test_a_rank_binds_its_collectives_to_the_configured_interface(tmp_path):
    """A multi-node configuration's interface reaches gloo: a name no interface has makes gloo refuse it."""
    from gradstat.analysis.training.distributed_launch import build_config

    config = build_config("fc300", 1, [], iterations=1, out=tmp_path / "r", interface="gradstat-none0")
    (tmp_path / "r").mkdir()
    config.save(tmp_path / "r" / "c.json")
    env = {**ENV, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    rank = [sys.executable, "-m", "gradstat.analysis.training.distributed", "--config", str(tmp_path / "r" / "c.json")]
    proc = subprocess.run([*rank, "--store-file", str(tmp_path / "store")], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "Unable to find address for: gradstat-none0" in proc.stderr
