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

from gradstat.analysis.dumps import open_dump

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")

CRASH_POINTS = textwrap.dedent("""
    # Crash-point enumeration: for k = 1, 2, ..., a forked child starts write_step and SIGKILLs itself at its k-th
    # file-system operation (each write, which first writes half its data, each fsync, each rename); the parent
    # then opens the dump and reports what it holds. Stops once a child finishes without reaching its point k.
    import json, os, signal, sys, torch
    import gradstat.analysis.dumps.atomic as atomic
    from gradstat.analysis.dumps import DumpWriter, open_dump
    torch.set_num_threads(1)
    path = sys.argv[1]
    params = [("a", (1000,)), ("b", (3,))]
    grads = lambda s: [{"a": torch.full((1000,), float(s)), "b": torch.ones(3)}] * 2
    DumpWriter(path, workload="toy", params=params, workers=2).write_step(0, grads(0))
    state = {"count": 0, "kill_at": 0}

    def point():
        state["count"] += 1
        if state["count"] == state["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)

    class File:
        def __init__(self, f): self.f = f
        def __enter__(self): return self
        def __exit__(self, *a): self.f.close()
        def write(self, data):
            data = memoryview(data).cast("B")
            self.f.write(data[: len(data) // 2]); self.f.flush()
            point()
            return self.f.write(data[len(data) // 2:])
        def __getattr__(self, name): return getattr(self.f, name)

    real_open, real_fsync, real_replace = open, os.fsync, os.replace
    atomic.open = lambda *a, **k: File(real_open(*a, **k))
    atomic.os.fsync = lambda fd: (point(), real_fsync(fd))[1]
    atomic.os.replace = lambda a, b: (point(), real_replace(a, b))[1]
    results, step = [], 1
    for k in range(1, 100):
        pid = os.fork()
        if pid == 0:
            state["kill_at"] = k
            DumpWriter.append(path).write_step(step, grads(step))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        try:
            d = open_dump(path)
            d.verify()
            values = [float(d.flat(s, 1)[0]) for s in d.steps]
            results.append({"k": k, "killed": killed, "steps": d.steps, "values": values})
        except Exception as exc:
            results.append({"k": k, "killed": killed, "error": str(exc)})
        if not killed:
            break
        if results[-1].get("steps", [None])[-1] == step:
            step += 1
    print(json.dumps(results))
""")


def test_sigkill_at_every_point_of_a_write(tmp_path):
    """SIGKILL at each file-system operation of write_step (mid-write included): the dump always opens and
    verifies, holds every step committed before, and holds the new step only if the kill came after its commit."""
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_POINTS, str(tmp_path / "dump")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    committed = [0]
    for r in results:
        assert "error" not in r, r
        assert r["steps"][: len(committed)] == committed and len(r["steps"]) - len(committed) in (0, 1), r
        assert r["values"] == [float(s) for s in r["steps"]]
        committed = r["steps"]
    kills = [r for r in results if r["killed"]]
    assert len(kills) >= 8, results  # step file: write (killed halfway), fsync, rename, dir fsync; manifest: same
    assert not results[-1]["killed"] and committed[-1] >= 1


def test_sigkill_of_gradstat_record(tmp_path):
    """The real command: kill `gradstat record` once it has committed a step."""
    path = tmp_path / "rec"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gradstat",
            "record",
            "--workload",
            "fc300:batch_size=8",
            "--iterations",
            "100000",
            "--workers",
            "2",
            "--out",
            str(path),
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
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
