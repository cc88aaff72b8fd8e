"""``gradstat --help`` and every ``gradstat COMMAND --help`` answer without importing torch, scipy or pandas (each
command imports what it needs when it runs), checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "scipy", "pandas")

PROGRAM = f"""
import contextlib, io, sys
from gradstat.analysis.cli.main import main, walk
paths = [()] + [path for path, _ in walk()]
for path in paths:
    with contextlib.redirect_stdout(io.StringIO()):
        status = main([*path, "--help"])
    if status != 0:
        raise SystemExit(f"gradstat {{' '.join(path)}} --help: exit status {{status}}")
print(len(paths), ",".join(m for m in {HEAVY!r} if m in sys.modules))
"""


def test_help_of_every_command_imports_neither_torch_nor_scipy_nor_pandas():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, _, heavy = done.stdout.strip().partition(" ")
    assert int(count) > 10  # the whole command tree was walked
    assert heavy == "", f"--help imported {heavy}"


MODULE_PROGRAM = f"""
import runpy, sys
sys.argv = ["gradstat", "--help"]
try:
    runpy.run_module("gradstat", run_name="__main__")
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
print(",".join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)
"""


def test_python_m_gradstat_help_imports_none_of_them():
    done = subprocess.run([sys.executable, "-c", MODULE_PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Usage: gradstat" in done.stdout
    assert done.stderr.strip() == "", f"python -m gradstat --help imported {done.stderr.strip()}"


def test_the_dtype_help_names_every_storage_dtype():
    # written out in the command module so that --help does not import torch; held equal to the dump format's
    from gradstat.analysis.cli.dump_cmds import STORAGE_DTYPE_HELP
    from gradstat.analysis.dumps.format import STORAGE_DTYPES

    listed = STORAGE_DTYPE_HELP.partition(":")[2].strip(" .").replace(" or ", ", ").split(", ")
    assert listed == list(STORAGE_DTYPES)
