"""The README's command table lists exactly the commands of the click tree, and each row's example parses."""

from __future__ import annotations

import re
from pathlib import Path

from gradstat.analysis.cli.main import cli, leaves

README = Path(__file__).resolve().parents[2] / "README.md"


def _table_walk() -> list[list[str]]:
    """The first cell's ``gradstat ...`` example of every row of the table under ``## Commands``, as words."""
    section = README.read_text(encoding="utf-8").split("\n## Commands\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `gradstat")]
    assert rows, "no command table under ## Commands"
    first_cells = [re.split(r"(?<!\\)\|", row)[1] for row in rows]
    return [re.match(r"\s*`gradstat ([^`]*)`", cell).group(1).split() for cell in first_cells]


def _path(words: list[str]) -> tuple[str, ...]:
    """The command path at the start of an example: the words before the first argument, option or placeholder."""
    path = []
    for w in words:
        if w.startswith(("-", "[")) or not w.islower():
            break
        path.append(w)
    return tuple(path)


def test_the_readme_table_lists_every_command_once():
    listed = [_path(words) for words in _table_walk()]
    assert len(listed) == len(set(listed)), "a command is listed twice"
    code = set(leaves())
    assert not set(listed) - code, f"in the README but not a command: {sorted(set(listed) - code)}"
    assert not code - set(listed), f"commands missing from the README table: {sorted(code - set(listed))}"


def test_every_example_in_the_table_parses():
    """Each row's example is accepted by the command's parser (placeholders D, SRC, R, SPEC filled in)."""
    fill = {"D": "dump", "SRC": "src.pt", "R": "report", "SPEC": "topk:ratio=0.01", "[D]": "dump", "[TOPIC]": "dumps"}
    for words in _table_walk():
        path = _path(words)
        args = [fill.get(w, w) for w in words[len(path) :]]
        group = cli
        ctx = cli.make_context("gradstat", [], resilient_parsing=True)
        for name in path:
            cmd = group.get_command(ctx, name)
            ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
            group = cmd
        cmd.make_context(path[-1], args, parent=ctx.parent)  # raises a UsageError if an option is wrong
