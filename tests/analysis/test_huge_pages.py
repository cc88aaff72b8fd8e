"""The ``gradstat`` command asks torch's CPU allocator for huge pages before torch allocates anything, keeps a
value the environment gives, and the benchmark header says which setting a run had."""

from __future__ import annotations

import os
import subprocess
import sys

from gradstat.analysis.measure import huge_pages

PROBE = "import os; import gradstat.analysis.cli.main; print(os.environ.get('THP_MEM_ALLOC_ENABLE'))"


def _probe(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != huge_pages.VARIABLE}
    if env_value is not None:
        env[huge_pages.VARIABLE] = env_value
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout


def test_the_command_keeps_a_value_the_environment_gives():
    assert _probe("0").strip() == "0"


def test_the_command_requests_huge_pages_before_torch_is_imported(monkeypatch):
    """Unset in the environment, the command sets it to 1; torch reads the variable once, at its first allocation,
    so the request must precede torch's import."""
    monkeypatch.delenv(huge_pages.VARIABLE, raising=False)
    code = (
        "import sys, builtins; real = builtins.__import__\n"
        "def spy(name, *a, **k):\n"
        "    if name == 'torch' and 'torch' not in sys.modules:\n"
        "        import os; print('at torch import:', os.environ.get('THP_MEM_ALLOC_ENABLE'))\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = spy\n"
        "import gradstat.analysis.cli.main\n"
        "import torch\n"  # the command line imports torch only in a command, after the request
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "at torch import: 1"


def test_kernel_mode_reads_the_bracketed_setting(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert huge_pages.kernel_mode(setting) == "madvise"
    setting.write_text("[always] madvise never\n")
    assert huge_pages.kernel_mode(setting) == "always"
    assert huge_pages.kernel_mode(tmp_path / "missing") == "unknown"


def test_describe_names_the_variable_and_the_kernel_mode(monkeypatch):
    monkeypatch.setattr(huge_pages, "_LATE", [])
    monkeypatch.setattr(huge_pages, "kernel_mode", lambda: "madvise")
    monkeypatch.setenv(huge_pages.VARIABLE, "1")
    assert huge_pages.describe() == (
        "huge pages for large CPU tensors on (THP_MEM_ALLOC_ENABLE=1; kernel transparent huge pages: madvise)"
    )
    monkeypatch.setenv(huge_pages.VARIABLE, "0")
    assert huge_pages.describe().startswith("huge pages for large CPU tensors off (THP_MEM_ALLOC_ENABLE=0;")
    monkeypatch.delenv(huge_pages.VARIABLE)
    monkeypatch.setattr(huge_pages, "kernel_mode", lambda: "always")
    assert huge_pages.describe().startswith("huge pages for large CPU tensors on (THP_MEM_ALLOC_ENABLE unset;")
    monkeypatch.setattr(huge_pages, "kernel_mode", lambda: "never")
    monkeypatch.setenv(huge_pages.VARIABLE, "1")
    assert huge_pages.describe().startswith("huge pages for large CPU tensors off")
    monkeypatch.setattr(huge_pages, "kernel_mode", lambda: "unknown")  # no kernel setting to read
    assert huge_pages.describe().startswith("huge pages for large CPU tensors unknown (THP_MEM_ALLOC_ENABLE=1;")


def test_a_request_made_after_torch_was_imported_is_not_reported_as_in_effect(monkeypatch):
    """This process imported torch long ago: a request now may come after torch read the variable, and the
    header says it cannot tell rather than claiming huge pages."""
    monkeypatch.setenv(huge_pages.VARIABLE, "unset")  # recorded, so the value request() writes is undone after
    monkeypatch.delenv(huge_pages.VARIABLE)
    monkeypatch.setattr(huge_pages, "_LATE", [])
    monkeypatch.setattr(huge_pages, "kernel_mode", lambda: "madvise")
    huge_pages.request()
    assert huge_pages.describe().startswith(
        "huge pages for large CPU tensors unknown (THP_MEM_ALLOC_ENABLE=1 was set after torch was imported"
    )
