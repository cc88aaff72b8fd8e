"""A recording killed with SIGKILL at an arbitrary moment leaves a dump that opens, verifies and holds every step
finished before the kill; reopening it appends."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from analysis.dumps import DumpWriter, open_dump

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")

WRITER = textwrap.dedent("""
    import sys, torch
    from analysis.dumps import DumpWriter
    torch.set_num_threads(1)
    params = [("big", (1 << 20,)), ("small", (7,))]
    w = DumpWriter(sys.argv[1], workload="toy", params=params, workers=2)
    gen = torch.Generator().manual_seed(0)
    for step in range(10_000):
        grads = [{"big": torch.randn(1 << 20, generator=gen), "small": torch.randn(7, generator=gen)}
                 for _ in range(2)]
        w.write_step(step, grads)
        print(step, flush=True)
""")


def _kill_after(cmd: list[str], committed: int, delay: float) -> list[int]:
    """Run ``cmd``, wait until it reports ``committed`` finished steps, sleep ``delay``, SIGKILL it; return the
    steps it reported finished."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    done = []
    try:
        while len(done) < committed:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"writer ended early: {proc.stderr.read()}")
            done.append(int(line.split()[0]))
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return done


@pytest.mark.parametrize("delay", [0.0, 0.037])
def test_sigkill_mid_recording_keeps_finished_steps(tmp_path, delay):
    path = tmp_path / "dump"
    finished = _kill_after([sys.executable, "-c", WRITER, str(path)], committed=2, delay=delay)
    d = open_dump(path)
    # every step reported finished is there; at most the steps written after the last report are extra
    assert d.steps[:len(finished)] == finished
    assert d.steps == list(range(len(d.steps)))
    d.verify()
    w = DumpWriter.append(path)
    nxt = d.steps[-1] + 1
    import torch
    w.write_step(nxt, [{"big": torch.zeros(1 << 20), "small": torch.ones(7)}] * 2)
    d = open_dump(path)
    assert d.steps[-1] == nxt and d.uncommitted == []
    d.verify()


def test_sigkill_of_gradstat_record(tmp_path):
    """The real command: kill `gradstat record` once it has committed a step."""
    path = tmp_path / "rec"
    proc = subprocess.Popen([sys.executable, "-m", "analysis", "record", "--workload", "fc300:batch_size=8",
                             "--steps", "100000", "--workers", "2", "--out", str(path), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if len(json.loads((path / "manifest.json").read_text())["steps"]) >= 3:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    d = open_dump(path)
    assert len(d.steps) >= 3 and d.steps == list(range(len(d.steps)))
    assert d.numel == 266_610 and d.workers == 2
    d.verify()
