"""Every command's and subcommand's ``--help`` works and is complete: the listing of each group shows every
command's whole summary (a sentence, never cut), and every option says what it does."""

from __future__ import annotations

import click
import pytest

from gradstat.analysis.cli.main import cli, main, walk
from gradstat.analysis.cli.options import summary

ALL = [((), cli)] + walk()
ABBREVIATIONS = ("Fig.", "fig.", "Eq.", "eq.", "e.g.", "i.e.", "vs.", "Sec.", "Thm.", "cf.", "App.", "Def.")


def _ids(items):
    return [" ".join(path) or "gradstat" for path, _ in items]


def _collapse(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path, cmd", ALL, ids=_ids(ALL))
def test_help_prints_usage_and_the_whole_help_text(path, cmd, capsys):
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: {' '.join(('gradstat', *path))} ")
    assert _collapse(cmd.help or "") and _collapse(cmd.help).split("\n\n")[0] in _collapse(out)


@pytest.mark.parametrize("path, cmd", walk(), ids=_ids(walk()))
def test_summary_is_a_whole_sentence_shown_in_full_by_the_parent(path, cmd, capsys):
    text = summary(cmd)
    assert text.endswith(".") and not text.endswith(ABBREVIATIONS), f"summary cut or unfinished: {text!r}"
    assert main([*path[:-1], "--help"]) == 0
    listing = _collapse(capsys.readouterr().out.split("Commands:", 1)[1])
    assert f"{path[-1]} {text}" in listing, f"the listing cuts {text!r}"


@pytest.mark.parametrize("path, cmd", walk(), ids=_ids(walk()))
def test_every_option_has_help(path, cmd):
    undocumented = [
        p.opts[0] for p in cmd.params if isinstance(p, click.Option) and not p.hidden and not _collapse(p.help or "")
    ]
    assert not undocumented, f"gradstat {' '.join(path)}: options without help: {undocumented}"
