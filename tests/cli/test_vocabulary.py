"""One vocabulary across commands: law names with their aliases, ``--steps`` selecting recorded steps (export
included), ``--iterations`` for how long to train."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gradstat import compressors
from gradstat.analysis.cli.main import main
from gradstat.theory.distributions.names import DISTRIBUTIONS, distribution_name


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    """linreg, 2 workers, 12 iterations recorded every 2 (steps 0, 2, ..., 10)."""
    from gradstat.analysis.training.recorder import record

    return record("linreg", 12, every=2, workers=2, out=tmp_path_factory.mktemp("vocab") / "d", progress=False)


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "canonical, aliases",
    [
        ("exponential", ["exponential", "exp", "laplace", "Laplace", "EXP", "double_exponential"]),
        ("gamma", ["gamma", "Gamma"]),
        ("genpareto", ["genpareto", "gp", "GPD", "generalized-pareto", "generalised_pareto"]),
    ],
)
def test_every_alias_names_the_same_law_everywhere(canonical, aliases, capsys):
    shape = [] if canonical == "exponential" else ["--shape", "0.3"]
    outputs = set()
    for name in aliases:
        assert distribution_name(name) == canonical
        assert compressors.create(f"sidco:dist={name},ratio=0.01").dist == canonical
        code, out, _ = _run(
            capsys, "theory", "sidco-threshold", "--dist", name, *shape, "--scale", "2", "--ratio", "0.01"
        )
        assert code == 0
        outputs.add(out)
    assert len(outputs) == 1  # the same answer whatever the spelling
    assert f"dist={canonical}," in compressors.create(f"sidco:dist={aliases[-1]}").spec()  # output: canonical only


def test_an_unknown_law_is_refused_with_the_accepted_names(capsys):
    code, _, err = _run(capsys, "theory", "sidco-threshold", "--dist", "normal", "--scale", "1", "--ratio", "0.1")
    assert code == 2 and err.count("\n") == 1
    assert all(name in err for name in DISTRIBUTIONS) and "laplace" in err and "gp" in err
    with pytest.raises(ValueError, match="sidco dist 'weibull'"):
        compressors.create("sidco:dist=weibull")


def test_synthetic_vectors_are_labelled_with_the_canonical_name(tmp_path, capsys):
    argv = ["variance", "--synthetic", "laplace", "--compressor", "topk:ratio=0.1", "--n", "64", "--trials", "4"]
    code, _, _ = _run(capsys, *argv, "--vectors", "1", "--out", tmp_path, "--quiet")
    assert code == 0 and pd.read_csv(tmp_path / "variance.csv")["vector"].tolist() == ["synthetic Laplace(1) #0"]


@pytest.mark.parametrize(
    "steps, chosen",
    [("0-5", [0, 2, 4]), ("0,6,10", [0, 6, 10]), ("last:2", [8, 10]), ("first:1", [0]), ("2-10:4", [2, 6, 10])],
)
def test_export_selects_steps_with_the_analysis_grammar(dump, tmp_path, capsys, steps, chosen):
    code, out, _ = _run(capsys, "export", dump, "--steps", steps, "--workers", "1", "--out", tmp_path / "e.npz")
    assert code == 0 and f"exported {len(chosen)} steps" in out
    with np.load(tmp_path / "e.npz") as z:
        assert sorted(int(k.split("/")[0][1:]) for k in z.files) == chosen and {k.split("/")[1] for k in z.files} == {
            "w1"
        }


def test_a_step_that_was_not_recorded_names_the_recorded_ones(dump, tmp_path, capsys):
    code, _, err = _run(capsys, "fit", dump, "--steps", "3", "--out", tmp_path / "x")
    assert code == 2 and "--steps: 3 is not available; available steps: 0, 2, 4, 6, 8, 10" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("command", [["record", "--workload", "linreg"], ["demo"]])
def test_training_commands_take_iterations_and_explain_steps(command, tmp_path, capsys):
    code, _, err = _run(capsys, *command, "--steps", "3", "--out", tmp_path / "x")
    assert code == 2 and "use --iterations 3 for how long to train" in err and not (tmp_path / "x").exists()
    code, _, err = _run(capsys, *command, "--iterations", "0", "--out", tmp_path / "x")
    assert code == 2 and "--iterations must be a positive integer, got 0" in err and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "command",
    [["validate", "--quick"], ["plot", "variance-vs-gain"], ["feedback"], ["variance", "--synthetic", "gamma"]],
)
def test_a_selection_without_a_dump_is_an_error_not_ignored(command, tmp_path, capsys):
    code, _, err = _run(capsys, *command, "--steps", "0-3", "--out", tmp_path / "x")
    assert code == 2 and "--steps select recorded gradients: give a DUMP" in err and not (tmp_path / "x").exists()
