"""Selections (--steps/--layers/--workers/--device) and table output."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from gradstat.analysis.measure.selection import parse_floats, parse_indices, parse_layers, resolve_device
from gradstat.analysis.measure.tables import to_markdown, write_table


def test_step_selection_grammar():
    avail = [0, 5, 10, 15, 20]
    assert parse_indices(None, avail) == avail
    assert parse_indices("5", avail) == [5]
    assert parse_indices("0-12", avail) == [0, 5, 10]
    assert parse_indices("0-20:10", avail) == [0, 10, 20]
    assert parse_indices("first:2", avail) == [0, 5]
    assert parse_indices("last:2", avail) == [15, 20]
    assert parse_indices("20,0", avail) == [0, 20]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("7", "not available"),
        ("x", "not an integer"),
        ("9-1", "empty"),
        ("100-200", "selects nothing"),
        ("first:0", "N must be"),
    ],
)
def test_bad_step_selections_name_the_problem(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_indices(spec, [0, 5, 10])


def test_layer_patterns():
    params = ["conv1.weight", "conv1.bias", "fc.weight"]
    assert parse_layers("conv*.weight", params) == ["conv1.weight"]
    assert parse_layers("fc.weight,conv1.bias", params) == ["conv1.bias", "fc.weight"]
    with pytest.raises(ValueError, match="matches no parameter"):
        parse_layers("lstm*", params)


def test_float_lists_are_range_checked():
    assert parse_floats("0.1,0.01", "ratio", 0.0, 1.0) == [0.1, 0.01]
    with pytest.raises(ValueError, match=r"--ratio: 1.5 must lie in \(0.0, 1.0\)"):
        parse_floats("0.1,1.5", "ratio", 0.0, 1.0)
    with pytest.raises(ValueError, match="not a number"):
        parse_floats("a", "ratio", 0.0, 1.0)


def test_device_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="cpu, cuda or auto"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            resolve_device("cuda")


def test_write_table_writes_csv_and_markdown(tmp_path):
    df = pd.DataFrame({"a": [1.0, float("nan")], "b": ["x|y", "z"]})
    paths = write_table(df, tmp_path, "t")
    assert pd.read_csv(paths["csv"]).shape == (2, 2)
    md = paths["md"].read_text()
    assert md.splitlines()[0] == "| a | b |" and "x\\|y" in md
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary left behind
    assert to_markdown(df).count("\n") == 4
    with pytest.raises(ValueError, match="plain file name"):
        write_table(df, tmp_path, "a/b")


def test_csv_log_writes_each_row_as_it_comes(tmp_path):
    """Nothing lost on interruption: rows are on disk before the log is closed."""
    from gradstat.analysis.measure.tables import CsvLog

    log = CsvLog(tmp_path / "rows.csv")
    log.add({"step": 0, "value": 1.5, "note": "a,b"})
    log.add([{"step": 1, "value": float("nan"), "note": None}])
    df = pd.read_csv(tmp_path / "rows.csv")  # still open
    assert list(df["step"]) == [0, 1] and df["note"].iloc[0] == "a,b" and df["value"].isna().iloc[1]
    log.close()


def test_report_without_a_dump_has_the_synthetic_sections(tmp_path):
    from gradstat.analysis.cli.main import main

    assert main(["report", "--out", str(tmp_path), "--quick", "--checks", "topk", "--quiet"]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "## Validation: 2 checks, 2 on synthetic vectors" in text and "## Threshold quality" not in text
