"""Experiment 7, SIDCo's micro-benchmark: the speed-up table is the bench table's own timings rearranged, every size,
ratio and method is there, and every comparison row and the verdict follow from the table. Timings are never
asserted (they are the measurement); what is asserted is the arithmetic and the bookkeeping around them."""

from __future__ import annotations

import itertools
import math
import os
import pathlib

import pandas as pd
import pytest
import torch

from gradstat.analysis.cli.main import main
from gradstat.analysis.experiments import sidco_microbench as mb
from gradstat.analysis.experiments.base import overall_verdict, run_experiment
from gradstat.analysis.experiments.index import index_rows, write_index
from gradstat.analysis.experiments.registry import get_experiment

KEYS = ["size", "threads", "ratio"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("sidco-microbench")
    result, readme = run_experiment(get_experiment("sidco-microbench"), out, quick=True)
    return result, readme, out


def test_speedup_is_the_topk_time_timed_beside_the_method_over_its_time(quick):
    bench, table = quick[0].tables["bench"], quick[0].tables["speedup"]
    own = bench[bench["group"] == "sparsifier"].set_index(KEYS + ["name"])
    for _, row in table.iterrows():
        key = (row["size"], row["threads"], row["ratio"], row["name"])
        assert row["topk_ms"] == own.loc[key, "topk_ms"] > 0  # (its own torch.topk calls, interleaved with its own)
        assert row["ms"] == own.loc[key, "ms"]
        assert row["speedup"] == pytest.approx(row["topk_ms"] / row["ms"], rel=1e-12)
        # the bench computes its own speed-up column in the same run: the two agree
        assert row["speedup"] == pytest.approx(own.loc[key, "speedup_vs_topk"], rel=1e-12)


def test_a_bench_table_without_paired_baselines_takes_the_topk_row_s_time(quick):
    """Tables written before the baselines were paired (no ``topk_ms`` column) still give their speed-ups."""
    bench = quick[0].tables["bench"].drop(columns=["topk_ms"])
    table = mb.speedup_table(bench)
    topk = bench[bench["name"] == mb.BASELINE].set_index(KEYS)["ms"]
    for _, row in table.iterrows():
        assert row["topk_ms"] == topk.loc[(row["size"], row["threads"], row["ratio"])]
        assert row["speedup"] == pytest.approx(row["topk_ms"] / row["ms"], rel=1e-12)


def test_every_size_ratio_thread_count_and_method_is_in_the_table(quick):
    table = quick[0].tables["speedup"]
    threads = sorted(table["threads"].unique())
    assert threads == ["1", f"all ({os.cpu_count()})"]  # the quick size's thread counts: one, and every core
    expected = set(
        itertools.product(mb.QUICK["sizes"], threads, mb.QUICK["ratios"], list(mb.PAPER_METHODS) + list(mb.OWN_METHODS))
    )
    assert set(map(tuple, table[KEYS + ["name"]].itertuples(index=False))) == expected
    assert len(table) == len(expected)
    assert (table["ms"] > 0).all() and (table["topk_ms"] > 0).all()


def test_each_comparison_row_is_recomputed_from_the_table(quick):
    result = quick[0]
    table = result.tables["speedup"]
    rows = {c.quantity: c for c in result.comparisons}
    for threads, t in table.groupby("threads"):
        where = f"CPU, threads {threads}"
        large = t[t["size"] > t["size"].min()]
        span = f"sizes >= {large['size'].min():,}"
        for name in mb.THRESHOLD_METHODS:
            c = rows[f"{where}: {mb.PAPER_METHODS[name]} speed-up over Top-k, least over {span} and every ratio"]
            least = large[large["name"] == name]["speedup"].min()
            assert c.ours == least and c.holds() == (least >= 1.0)
        c = rows[f"{where}: DGC speed-up over Top-k, largest over every size and ratio"]
        assert c.ours == t[t["name"] == "dgc"]["speedup"].max() and c.holds() == (c.ours <= 1.0)
        dgc = t[t["name"] == "dgc"].set_index(["size", "ratio"])["speedup"]
        e = t[t["name"] == mb.SIDCO_E].set_index(["size", "ratio"])
        c = rows[f"{where}: SIDCo-E over DGC (SIDCo-E speed-up / DGC speed-up), least over every size and ratio"]
        assert c.ours == pytest.approx((e["speedup"] / dgc).min()) and c.holds() == (c.ours >= 2.0)
        hi, lo = t["size"].max(), t["size"].min()
        growth = min(e.loc[(hi, r), "speedup"] / e.loc[(lo, r), "speedup"] for r in mb.QUICK["ratios"])
        c = rows[f"{where}: SIDCo-E speed-up at the largest / the smallest size, least over the ratios"]
        assert c.ours == pytest.approx(growth)
    assert len(rows) == len(result.comparisons) == 2 * (len(mb.THRESHOLD_METHODS) + 4)
    text = quick[1].read_text()
    assert f"**Verdict:** {overall_verdict(result.comparisons)}." in text
    assert "16-core Xeon Silver 4112" in text and "compare the trends" in text


def test_trend_notes_count_the_cells_from_the_table(quick):
    result = quick[0]
    e = result.tables["speedup"][lambda t: t["name"] == mb.SIDCO_E]
    for threads, et in e.groupby("threads"):
        faster = sum(v > 1 for v in et["speedup"])
        grows = 0
        for _, grp in et.groupby("ratio"):
            v = list(grp.sort_values("size")["speedup"])
            grows += all(a < b for a, b in zip(v[:-1], v[1:], strict=True))
        line = (
            f"Trend, CPU, threads {threads}: SIDCo-E is faster than Top-k in {faster} of {len(et)} (size, ratio) "
            f"cells, and its speed-up grows with every size step at {grows} of 3 ratios."
        )
        assert line in result.notes


def hand_table() -> pd.DataFrame:
    """Two sizes, one ratio, one thread count, hand-chosen times: Top-k 1 ms then 10 ms; SIDCo-E 2 ms then 5 ms
    (speed-up 0.5 then 2); DGC 4 ms then 20 ms; the other methods 0.8 ms then 4 ms (speed-up 1.25 then 2.5)."""
    rows = []
    times = {"dgc": (4.0, 20.0), mb.SIDCO_E: (2.0, 5.0)}
    for i, (size, topk) in enumerate(((1000, 1.0), (10_000, 10.0))):
        for name in list(mb.PAPER_METHODS) + list(mb.OWN_METHODS):
            ms = times.get(name, (0.8, 4.0))[i]
            rows.append({"size": size, "threads": "1", "ratio": 0.01, "name": name, "ms": ms, "topk_ms": topk})
    t = pd.DataFrame(rows)
    t["speedup"] = t["topk_ms"] / t["ms"]
    t["paper_method"] = t["name"].isin(list(mb.PAPER_METHODS))
    return t


def test_comparisons_on_hand_made_timings():
    rows = {c.quantity.partition(": ")[2]: c for c in mb.compare(hand_table())}
    e = rows["SIDCo-E (exp, M=3) speed-up over Top-k, least over sizes >= 10,000 and every ratio"]
    assert e.ours == 2.0 and e.verdict() == "holds"  # the small size (0.5x) is not judged
    g = rows["SIDCo-GP (gamma, M=3) speed-up over Top-k, least over sizes >= 10,000 and every ratio"]
    assert g.ours == 2.5 and g.holds()
    d = rows["DGC speed-up over Top-k, largest over every size and ratio"]
    assert d.ours == 0.5 and d.verdict() == "holds"
    assert rows["share of (size, ratio) cells where DGC is the slowest of the paper's methods and Top-k"].ours == 1.0
    over = rows["SIDCo-E over DGC (SIDCo-E speed-up / DGC speed-up), least over every size and ratio"]
    assert over.ours == 2.0 and over.verdict() == "holds"
    grow = rows["SIDCo-E speed-up at the largest / the smallest size, least over the ratios"]
    assert grow.ours == 4.0 and grow.holds()


def test_a_slow_sidco_fails_its_row_by_the_measured_factor():
    t = hand_table()
    t.loc[t["name"] == mb.SIDCO_E, "ms"] *= 8  # now 16 ms then 40 ms: speed-up 1/16 then 1/4
    t["speedup"] = t["topk_ms"] / t["ms"]
    rows = {c.quantity.partition(": ")[2]: c for c in mb.compare(t)}
    e = rows["SIDCo-E (exp, M=3) speed-up over Top-k, least over sizes >= 10,000 and every ratio"]
    assert e.ours == 0.25 and e.verdict() == "fails (0.25 vs 1)"
    assert rows["share of (size, ratio) cells where DGC is the slowest of the paper's methods and Top-k"].ours == 0.0


def test_gpu_rows_state_the_gpu_claims():
    t = hand_table()
    t["threads"] = "cuda"
    rows = {c.quantity: c for c in mb.compare(t)}
    d = rows["GPU: DGC speed-up over Top-k, least over every size and ratio"]
    assert d.kind == "at_least" and d.ours == 0.25 and not d.holds()
    assert not any("share of" in q for q in rows)


def test_devices_are_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="runs on cpu only"):
        run_experiment(get_experiment("gmc"), tmp_path, quick=True, device="cuda")
    assert main(["experiment", "gmc", "--quick", "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "runs on cpu only" in capsys.readouterr().err
    assert main(["experiment", "list"]) == 0
    assert "sidco-microbench" in capsys.readouterr().out
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            run_experiment(get_experiment("sidco-microbench"), tmp_path, quick=True, device="cuda")


@pytest.mark.cuda
def test_quick_run_on_cuda(tmp_path):
    result, _ = run_experiment(get_experiment("sidco-microbench"), tmp_path, quick=True, device="cuda")
    table = result.tables["speedup"]
    assert set(table["threads"]) == {"cuda"}
    assert any(c.quantity.startswith("GPU: DGC") for c in result.comparisons)


def test_index_lists_every_output_folder_with_its_verdict(tmp_path):
    (tmp_path / "gmc").mkdir()
    (tmp_path / "gmc" / "README.md").write_text("# GMC\n\n**Verdict:** reproduces: all 3 agree.\n")
    for w in ("lenet", "fc300"):
        (tmp_path / "sidco-quality" / w).mkdir(parents=True)
        (tmp_path / "sidco-quality" / w / "README.md").write_text(f"**Verdict:** differs: {w}.\n")
    rows = index_rows(tmp_path)
    by = {(r["experiment"], r["run"]): r["verdict"] for r in rows}
    assert by[("gmc", "[gmc](gmc/README.md)")] == "reproduces: all 3 agree."
    assert by[("sidco-quality", "[sidco-quality/fc300](sidco-quality/fc300/README.md)")] == "differs: fc300."
    assert by[("sidco-quality", "[sidco-quality/lenet](sidco-quality/lenet/README.md)")] == "differs: lenet."
    assert by[("sidco-microbench", "not committed")].startswith("no full-size output yet")
    assert [r["experiment"] for r in rows].index("gmc") < [r["experiment"] for r in rows].index("sidco-quality")
    text = write_index(tmp_path).read_text()
    assert text.count("\n| ") == len(rows) + 1  # the header row and one row per output
    with pytest.raises(ValueError, match="not a folder"):
        write_index(tmp_path / "missing")


def test_bench_time_of_a_missing_method_is_not_comparable():
    t = hand_table()
    t = t[t["name"] != "redsync"]
    rows = {c.quantity.partition(": ")[2]: c for c in mb.compare(t)}
    r = rows["RedSync speed-up over Top-k, least over sizes >= 10,000 and every ratio"]
    assert math.isnan(r.ours) and r.verdict() == "not comparable"


def test_the_bench_page_of_the_same_run_is_written_beside_the_experiment(quick):
    out = quick[2]
    page = (out / "bench" / "bench.md").read_text()
    assert "## Goals" in page and "1-minute load average" in page
    bench = quick[0].tables["bench"]
    assert (out / "bench" / "bench.csv").read_text().count("\n") == len(bench) + 1  # the same table, every row


def test_the_committed_experiments_index_is_the_one_its_folders_give():
    """reports/experiments/README.md is generated from the committed experiment READMEs: regenerating it must give
    the committed text (an experiment rerun without rewriting the index leaves a stale verdict there)."""
    from gradstat.analysis.experiments.index import render

    root = pathlib.Path(__file__).resolve().parents[2] / "reports" / "experiments"
    if not (root / "README.md").is_file():
        pytest.skip("no committed experiments index in this tree")
    assert (root / "README.md").read_text() == render(index_rows(root))
