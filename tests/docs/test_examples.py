"""Every code example on the site runs: each Python block is a snippet of a file under ``docs/examples/`` (or a
test), and each such file is run here or in ``test_own_compressor.py``; each ``gradstat`` command line of a bash
block is accepted by the command's parser; other command lines run an example file that is tested."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from gradstat.analysis.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
SNIPPET = re.compile(r"^--8<--\n([^\n:]+)(?::\w+)?\n--8<--$")  # the block form (ruff format leaves it alone)

RUN_HERE = {"record_single.py", "ddp_record_train.py", "accelerate_record.py"}
RUN_IN_OWN_COMPRESSOR_TEST = {"my_compressor.py", "my_check.py", "my_ddp.py"}


def blocks(language: str) -> list[tuple[Path, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for lang, body in BLOCK.findall(page.read_text(encoding="utf-8")):
            if lang == language:
                found.append((page, body))
    return found


def command_lines() -> list[tuple[Path, list[str]]]:
    """Each command line of every bash block (continuation lines joined), as words."""
    lines = []
    for page, body in blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append((page, shlex.split(line)))
    return lines


def test_every_python_block_is_a_snippet_of_a_tested_file():
    tested = RUN_HERE | RUN_IN_OWN_COMPRESSOR_TEST
    for page, body in blocks("python"):
        match = SNIPPET.match(body.strip())
        assert match, f"{page.relative_to(ROOT)}: a Python block that is not a snippet include (untested code)"
        path = Path(match.group(1))
        assert path.parts[:2] == ("docs", "examples") and path.name in tested or path.parts[0] == "tests", (
            f"{page.relative_to(ROOT)} includes {path}, which no test runs"
        )
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested, "an example file that is not run by a test"


def _parse(words: list[str]) -> None:
    """Resolve the command path and parse its arguments (a wrong option or value raises a UsageError)."""
    ctx = cli.make_context("gradstat", [], resilient_parsing=True)
    group, args = cli, words[1:]
    while args and hasattr(group, "get_command") and group.get_command(ctx, args[0]) is not None:
        group = group.get_command(ctx, args[0])
        ctx = group.make_context(args[0], [], parent=ctx, resilient_parsing=True)
        args = args[1:]
    assert group is not cli, f"no such command: {' '.join(words)}"
    group.make_context(words[0], args, parent=ctx.parent)


def test_every_command_on_the_site_parses_or_runs_a_tested_example():
    kinds = set()
    for page, words in command_lines():
        where = f"{page.relative_to(ROOT)}: {' '.join(words)}"
        if words[0] == "gradstat":
            _parse(words)
            kinds.add("gradstat")
        elif words[:2] == ["pip", "install"] or words[0] == "mkdocs":
            kinds.add(words[0])  # installs and the docs build (test_build.py builds the site)
        else:
            scripts = [w for w in words if w.startswith("docs/examples/")]
            assert words[0] in ("python", "torchrun") and scripts, f"{where}: not a command these tests cover"
            assert Path(scripts[0]).name in RUN_HERE | RUN_IN_OWN_COMPRESSOR_TEST, f"{where}: untested example"
    assert "gradstat" in kinds


def test_a_wrong_option_fails_the_parse_check():
    with pytest.raises(Exception, match="no_such_option|No such option"):
        _parse(["gradstat", "fit", "D", "--no_such_option", "1"])


@pytest.fixture
def examples_on_path():
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))
    sys.modules.pop("record_single", None)


def test_recording_from_a_single_process_loop(examples_on_path, tmp_path, capsys):
    import record_single

    record_single.train_and_record(str(tmp_path / "my-dump"))
    record_single.analyse(str(tmp_path / "my-dump"))
    out = capsys.readouterr().out
    assert "steps [0, 2, 4] workers 1 parameters 1539" in out  # 20*64 + 64 + 64*3 + 3 parameters, every 2nd of 6
    assert re.search(r"top-k: \d+ bits, relative error 0\.\d+", out)


def test_recording_training_and_resuming_under_ddp(ddp_examples):
    from gradstat.analysis.dumps import open_dump

    for rank in ddp_examples["rows"]:
        rows = rank["ddp_record_train"]
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # 3 steps, then 2 after the resume
        assert len({r["bits"] for r in rows}) == 1 and rows[0]["bits"] > 0
        assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    dump = open_dump(ddp_examples["out"] / "dump")
    assert dump.steps == [0, 1, 2] and dump.workers == 2
    assert not torch.equal(dump.flat(0, worker=0), dump.flat(0, worker=1))  # each rank's own local gradient


def test_the_code_in_the_rendered_docstrings_runs(ddp_examples, tmp_path, monkeypatch):
    """The two code examples of the API reference (the docstrings' literal blocks that are code, not formulas):
    ``gradstat``'s usage, on a dump named ``my-dump``, and the DDP hook module's usage (run on the 2 ranks)."""
    from _ddp_examples import docstring_code

    import gradstat

    sys.path.insert(0, str(EXAMPLES))
    try:
        import record_single

        record_single.train_and_record(str(tmp_path / "my-dump"))
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop("record_single", None)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(docstring_code(gradstat.__doc__ or ""), scope)
    assert scope["est"].params and scope["c"].name == "topk"
    assert all(rank["hook_docstring_bits"] > 0 for rank in ddp_examples["rows"])


def _free_port() -> int:
    """A free loopback port for torchrun's rendezvous (its default, 29500, would meet another launch's)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_recording_under_accelerate(tmp_path):
    """The Accelerate example on 2 ranks (torchrun); skipped where Accelerate is not installed."""
    pytest.importorskip("accelerate")
    import subprocess

    from gradstat.analysis.dumps import open_dump

    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), str(EXAMPLES / "accelerate_record.py"), str(tmp_path / "dump")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(re.findall(r"rank \d step \d: \d+ bits", run.stdout)) == 6
    dump = open_dump(tmp_path / "dump")
    assert dump.steps == [0, 1, 2] and dump.workers == 2
