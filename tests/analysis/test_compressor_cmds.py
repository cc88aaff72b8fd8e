"""``gradstat compressors`` and the compressor benchmark module."""

from __future__ import annotations

import json

from gradstat import compressors
from gradstat.analysis.bench import compressors as bench
from gradstat.analysis.cli.main import main


def test_compressors_lists_every_registered_name_with_its_properties(capsys):
    assert main(["compressors"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["name", "kind", "unbiased"]
    listed = {line.split()[0] for line in out[1:]}
    assert listed == set(compressors.names())


def test_compressors_json_round_trips_the_declared_properties(capsys):
    assert main(["compressors", "--json", "--kind", "sparsifier"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["topk"]["contraction"] == "1 - delta" and by_name["wangni"]["unbiased"] is True
    assert all(r["kind"] == "sparsifier" for r in rows)
    assert compressors.create(by_name["sidco"]["spec"]) == compressors.create("sidco")


def test_a_kind_without_members_is_a_one_line_error(capsys):
    assert main(["compressors", "--kind", "identity"]) == 2
    assert capsys.readouterr().err.startswith("gradstat: error: no compressor of kind 'identity'")


def test_bench_measures_topk_in_the_same_run_and_counts_bits():
    table = bench.run(size=5000, repeats=1, names="topk,randk,threshold")
    assert list(table["compressor"]) == ["torch.topk", "topk", "randk", "threshold"]
    assert table.loc[0, "vs_topk"] == 1.0 and (table["ms"] > 0).all()
    row = table.set_index("compressor").loc["randk"]
    assert row["bits"] == 50 * 32 + 64 and row["gain"] == 32 * 5000 / (50 * 32 + 64)
    assert table.set_index("compressor").loc["threshold", "k_hat/k"] == 1.0  # oracle threshold keeps exactly k


def test_bench_rejects_unknown_names_and_bad_sizes():
    import pytest

    with pytest.raises(ValueError, match="unknown compressor"):
        bench.run(size=1000, names="nope")
    with pytest.raises(ValueError, match="ratio"):
        bench.run(size=1000, ratio=1.5)


def test_the_table_says_yes_and_no_and_prints_specs_that_rebuild_the_compressor(capsys):
    assert main(["compressors", "--kind", "sparsifier"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["wangni"][2:4] == ["yes", "yes"] and rows["topk"][2:4] == ["no", "no"]
    assert compressors.create(rows["gaussianksgd"][-1]) == compressors.create("gaussianksgd")
