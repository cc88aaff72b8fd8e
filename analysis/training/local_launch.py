"""Start the ranks of a single-machine ``gradstat train`` with nothing listening beyond the loopback interface.

torchrun's rendezvous store (a ``TCPStore``) listens on every interface whatever host it is given, and it has no
authentication: anyone who reaches its port can read and overwrite its keys, including one torch unpickles. One
machine needs no network rendezvous at all, so this launcher starts the P ranks itself
(``python -m gradstat.analysis.training.distributed --config FILE --store-file PATH``, with ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE`` set as torchrun would): they meet through a file store in a private temporary
folder (mode 0700, removed afterwards), and their collectives (gloo and NCCL's bootstrap) are bound to the loopback
interface. Each rank arms the parent-death signal (:mod:`.parent_death`), so killing this launcher ends them.

The launcher watches the ranks: when one exits with an error the others are stopped (they would otherwise wait in
a collective until the process-group timeout), and past ``wall_timeout_s`` all are stopped. Each rank's output goes
to ``rank-<r>.log`` in the results folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gradstat.analysis.training.parent_death import LAUNCHER_PID

ENTRY = "gradstat.analysis.training.distributed"
LOOPBACK = "lo"
"""Linux's loopback interface, where a single-machine run's collectives listen."""
POLL_S = 0.1


@dataclass
class LaunchOutcome:
    """Exit status of each rank (negative: stopped by that signal), the logs, the rank that failed first (or None)
    and whether the wall-clock limit stopped the run."""

    codes: list[int]
    logs: list[Path]
    first_failed: int | None
    timed_out: bool

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(c == 0 for c in self.codes)


def rank_command(config_path: Path, store: Path) -> list[str]:
    """The command line of one rank started by this launcher."""
    return [sys.executable, "-m", ENTRY, "--config", str(config_path), "--store-file", str(store)]


def loopback_env(nproc: int) -> dict[str, str]:
    """The environment shared by the ranks: world size, the launcher's pid, loopback-bound collectives."""
    env = {**os.environ, "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), LAUNCHER_PID: str(os.getpid())}
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = LOOPBACK
        env["NCCL_SOCKET_IFNAME"] = LOOPBACK
    return env


def launch_local(
    config_path: Path, nproc: int, logs_dir: Path, wall_timeout_s: float | None = None, grace_s: float = 5.0
) -> LaunchOutcome:
    """Run ``nproc`` ranks of ``config_path`` on this machine and wait for them (see the module docstring)."""
    env = loopback_env(nproc)
    logs = [logs_dir / f"rank-{r}.log" for r in range(nproc)]
    deadline = None if wall_timeout_s is None else time.monotonic() + wall_timeout_s
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="gradstat-rendezvous-") as private:
        store = Path(private) / "store"
        try:
            for r, log_path in enumerate(logs):
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            rank_command(config_path, store),
                            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                        )
                    )
            first_failed, timed_out = _watch(procs, deadline)
        finally:
            _stop(procs, grace_s)
    return LaunchOutcome([p.returncode for p in procs], logs, first_failed, timed_out)


def _watch(procs: list[subprocess.Popen[bytes]], deadline: float | None) -> tuple[int | None, bool]:
    """Wait until every rank has exited, one has failed (its index is returned) or the deadline has passed."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            return failed[0], False
        if all(c is not None for c in codes):
            return None, False
        if deadline is not None and time.monotonic() > deadline:
            return None, True
        time.sleep(POLL_S)


def _stop(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every rank still running, SIGKILL those still there after ``grace_s``; reap them all."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    end = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
