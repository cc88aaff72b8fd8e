"""The dump commands end to end: output content, exit status 2 with a one-line error, data never destroyed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gradstat.analysis.cli.main import main
from gradstat.analysis.dumps import open_dump


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def fc300_dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "fc300"
    assert (
        main(
            [
                "record",
                "--workload",
                "fc300:batch_size=8",
                "--iterations",
                "4",
                "--every",
                "2",
                "--workers",
                "2",
                "--out",
                str(path),
                "--quiet",
            ]
        )
        == 0
    )
    return path


def test_record_then_info(fc300_dump, capsys):
    code, out, _ = run(capsys, "info", str(fc300_dump))
    assert code == 0
    assert "2 steps x 2 workers x 6 tensors" in out
    assert "parameters 266,610 per worker per step" in out
    assert "fc1.weight  (300, 784)" in out
    assert "every 2: 0, 2" in out
    assert "step      2:" in out  # gradient norms per step
    d = open_dump(fc300_dump)
    assert d.manifest["optimizer"]["batch_size"] == 8 and d.manifest["seeds"]["seed"] == 0


def test_info_json(fc300_dump, capsys):
    code, out, _ = run(capsys, "info", str(fc300_dump), "--json")
    info = json.loads(out)
    assert code == 0 and info["parameters"] == 266_610 and info["steps"] == [0, 2] and info["workers"] == 2
    norms = info["gradient_norms"][1]
    d = open_dump(fc300_dump)
    assert norms["worker_norms"][1] == pytest.approx(float(d.flat(2, 1).norm()), rel=1e-6)


def test_workloads_lists_counts(capsys):
    code, out, _ = run(capsys, "workloads")
    assert code == 0
    for name, count in [
        ("fc300", "266,610"),
        ("lenet", "1,663,370"),
        ("resnet20", "269,722"),
        ("logreg", "7,850"),
        ("linreg", "3,200"),
        ("lstm", "222,285"),
    ]:
        assert any(line.startswith(name) and count in line for line in out.splitlines()), (name, out)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["record", "--workload", "nope", "--iterations", "2", "--out", "{tmp}/a"], "unknown workload 'nope'"),
        (["record", "--workload", "fc300", "--iterations", "0", "--out", "{tmp}/a"], "--iterations must be a positive"),
        (
            ["record", "--workload", "fc300", "--iterations", "2", "--workers", "-1", "--out", "{tmp}/a"],
            "workers must be",
        ),
        (
            ["record", "--workload", "fc300", "--iterations", "2", "--feedback", "ef", "--out", "{tmp}/a"],
            "needs a compressor",
        ),
        (["info", "{tmp}/missing"], "not a directory"),
        (["import", "{tmp}/missing.pt", "--out", "{tmp}/a"], "no such file"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    code, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2
    assert err.startswith("gradstat: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()


def test_record_refuses_a_foreign_directory_and_leaves_it(tmp_path, capsys):
    (tmp_path / "paper.tex").write_text("draft")
    code, _, err = run(capsys, "record", "--workload", "linreg", "--iterations", "2", "--out", str(tmp_path))
    assert code == 2 and "not a gradstat dump" in err
    assert [p.name for p in tmp_path.iterdir()] == ["paper.tex"] and (tmp_path / "paper.tex").read_text() == "draft"


def test_record_refuses_an_existing_dump(fc300_dump, capsys):
    before = (fc300_dump / "manifest.json").read_bytes()
    code, _, err = run(capsys, "record", "--workload", "fc300", "--iterations", "1", "--out", str(fc300_dump))
    assert code == 2 and "already holds a gradient dump" in err
    assert (fc300_dump / "manifest.json").read_bytes() == before


def test_info_on_a_corrupt_dump(tmp_path, capsys):
    main(["record", "--workload", "linreg", "--iterations", "2", "--out", str(tmp_path / "d"), "--quiet"])
    capsys.readouterr()
    (tmp_path / "d" / "manifest.json").write_text("garbage")
    code, _, err = run(capsys, "info", str(tmp_path / "d"))
    assert code == 2 and "manifest.json: not valid JSON" in err


def test_record_with_compressor_in_the_loop(tmp_path, capsys):
    code, out, _ = run(
        capsys,
        "record",
        "--workload",
        "linreg",
        "--iterations",
        "3",
        "--workers",
        "2",
        "--out",
        str(tmp_path / "d"),
        "--compressor",
        "topk:ratio=0.1",
        "--feedback",
        "ef",
        "--quiet",
        "--dtype",
        "bfloat16",
    )
    assert code == 0 and "3 steps x 2 workers x 1 tensors" in out
    d = open_dump(tmp_path / "d")
    assert d.extras == ["residual", "compensated"] and d.dtype == torch.bfloat16
    assert d.manifest["compression"]["compressor"].startswith("topk:ratio=0.1")
    code, out, _ = run(capsys, "info", str(tmp_path / "d"))
    assert "extras     residual, compensated" in out


def test_import_export_commands(fc300_dump, tmp_path, capsys):
    code, out, _ = run(capsys, "export", str(fc300_dump), "--steps", "2", "--out", str(tmp_path / "e.npz"))
    assert code == 0 and "exported 1 steps" in out
    with np.load(tmp_path / "e.npz") as z:
        assert "s2/w1/fc3.bias" in z.files and len(z.files) == 2 * 6
    code, out, _ = run(capsys, "import", str(tmp_path / "e.npz"), "--out", str(tmp_path / "back"))
    assert code == 0 and "imported 1 steps x 2 workers x 6 tensors (266,610 parameters)" in out
    assert torch.equal(open_dump(tmp_path / "back").flat(2, 1), open_dump(fc300_dump).flat(2, 1))
    code, _, err = run(capsys, "export", str(fc300_dump), "--steps", "1", "--out", str(tmp_path / "f.npz"))
    assert code == 2 and "--steps: 1 is not available" in err and not (tmp_path / "f.npz").exists()


@pytest.mark.slow
def test_done_when_lenet(tmp_path, capsys):
    """The issue's acceptance check, verbatim."""
    code, _, _ = run(
        capsys,
        "record",
        "--workload",
        "lenet",
        "--iterations",
        "20",
        "--every",
        "5",
        "--workers",
        "4",
        "--out",
        str(tmp_path / "X"),
        "--quiet",
    )
    assert code == 0
    code, out, _ = run(capsys, "info", str(tmp_path / "X"))
    assert "4 steps x 4 workers x 8 tensors" in out and "1,663,370" in out
