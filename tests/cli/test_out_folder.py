"""``--out``: a new folder is created, gradstat's own earlier result is replaced (saying so), a folder holding
anything else is refused untouched, and the command says where it wrote."""

from __future__ import annotations

import json

from gradstat.analysis.cli.main import main
from gradstat.analysis.cli.outputs import MANIFEST

VARIANCE = ["variance", "--synthetic", "exp", "--compressor", "topk:ratio=0.1", "--n", "64", "--trials", "4"]
PLOT = ["plot", "variance-vs-gain", "--n", "16", "--trials", "2"]


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([*map(str, argv), "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_new_folder_is_created_and_listed_in_its_manifest(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    code, text, _ = _run(capsys, *VARIANCE, "--vectors", "1", "--out", out)
    manifest = json.loads((out / MANIFEST).read_text())
    assert code == 0 and manifest["command"] == "variance"
    assert manifest["files"] == [f for f in _files(out) if f != MANIFEST] and "variance.csv" in manifest["files"]
    assert text.rstrip().endswith(f"wrote {len(manifest['files'])} files to {out}/")


def test_gradstat_replaces_its_own_earlier_result_and_says_so(tmp_path, capsys):
    out = tmp_path / "r"
    assert _run(capsys, *VARIANCE, "--vectors", "1", "--out", out)[0] == 0
    code, text, _ = _run(capsys, *PLOT, "--out", out)
    assert code == 0 and f"replacing the earlier result of `gradstat variance` in {out}/" in text
    assert "variance.csv" not in _files(out) and "variance_vs_gain.csv" in _files(out)  # nothing stale is left
    assert json.loads((out / MANIFEST).read_text())["command"] == "plot variance-vs-gain"


def test_a_folder_with_other_files_is_refused_and_left_as_it_was(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = _run(capsys, *VARIANCE, "--out", tmp_path)
    assert code == 2 and err.startswith("gradstat: error: --out") and "did not write (notes.txt)" in err
    assert _files(tmp_path) == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine"


def test_a_file_added_to_a_result_folder_protects_the_whole_folder(tmp_path, capsys):
    out = tmp_path / "r"
    assert _run(capsys, *VARIANCE, "--vectors", "1", "--out", out)[0] == 0
    before = _files(out)
    (out / "sub").mkdir()
    (out / "sub" / "draft.md").write_text("mine")
    code, _, err = _run(capsys, *PLOT, "--out", out)
    assert code == 2 and "sub/draft.md" in err and _files(out) == sorted(before + ["sub/draft.md"])


def test_out_naming_a_file_is_an_error(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code, _, err = _run(capsys, *VARIANCE, "--out", tmp_path / "f")
    assert code == 2 and "is a file, not a folder" in err and (tmp_path / "f").read_text() == "x"
