"""The micro-benchmark's speed goals are judged from its table (synthetic rows here), and host synchronisations are
counted on CUDA only."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from gradstat.analysis.bench._microbench_report import SIDCO_GOALS, _cuda_goals, _small_vector_goals, plot
from gradstat.analysis.bench.timing import host_syncs


def _row(size, threads, ratio, name, speedup, group="sparsifier", op="encode", **extra):
    return {"size": size, "threads": threads, "ratio": ratio, "group": group, "name": name, "op": op,
            "speedup_vs_topk": speedup, **extra}  # fmt: skip


def test_the_small_vector_goal_names_the_slowest_variant_and_fails_below_one():
    rows = [_row(260_000, "1", 0.001, n, 1.5) for n in SIDCO_GOALS]
    rows.append(_row(260_000, "1", 0.001, "sidco:dist=gamma,stages=3 (eager)", 0.1))  # a reference: not judged
    met = _small_vector_goals(pd.DataFrame(rows))
    assert len(met) == 1 and met[0].endswith("| yes |") and "least 1.50x" in met[0]
    rows[2] = _row(260_000, "1", 0.001, "sidco:dist=gamma,stages=3", 0.4)
    failed = _small_vector_goals(pd.DataFrame(rows))
    assert failed[0].endswith("| no |") and "0.40x (sidco:dist=gamma,stages=3; 1 of 5 below)" in failed[0]


def test_cuda_goals_judge_speed_ups_bandwidth_and_host_synchronisations():
    big = 26_000_000
    rows = [_row(big, "cuda", 0.01, n, goal) for n, goal in SIDCO_GOALS.items()]
    rows.append(_row(big, "cuda", 0.01, "threshold", 2.0, read_passes=2.5, host_syncs=0))
    rows.append({**_row(big, "cuda", None, "g.sum() (one read pass)", None, group="read", op="read"), "GB/s": 2000.0})
    rows.append({**_row(big, "cuda", None, "qsgd", None, group="quantizer"), "GB/s": 600.0, "host_syncs": 0})
    rows.append({**_row(big, "cuda", None, "qsgd", None, group="quantizer", op="decode"), "GB/s": 400.0})
    table = pd.DataFrame(rows)
    table["host_syncs"] = table.get("host_syncs", 0)
    table.loc[table["name"] == "dgc", "host_syncs"] = 2
    lines = _cuda_goals(table)
    text = "\n".join(lines)
    assert "sidco:dist=exp,stages=1 >= 3x torch.topk, delta=0.01 | 3.00x | yes" in text
    assert "threshold selection <= 3 read passes, delta=0.01 | 2.5 passes | yes" in text
    assert "qsgd encode >= 25 % of a read pass | 30 % | yes" in text
    assert "qsgd decode >= 25 % of a read pass | 20 % | no" in text
    assert lines[-1].endswith("| no |") and "synchronise: dgc" in lines[-1]
    assert _cuda_goals(table[table["threads"] != "cuda"]) == []  # no CUDA rows, no CUDA goals


def test_the_queued_encode_goal_counts_only_the_enqueue_and_reports_the_read_back():
    big = 26_000_000
    rows = [_row(big, "cuda", 0.01, n, 1.0, host_syncs=1, enqueue_syncs=0, settle_syncs=1) for n in SIDCO_GOALS]
    rows.append(_row(big, "cuda", 0.01, "torch.topk(|g|)", 1.0, host_syncs=0))  # the baseline: not judged
    rows.append(_row(big, "cuda", None, "qsgd", None, group="quantizer", enqueue_syncs=0, settle_syncs=1))
    rows.append(_row(big, "cuda", None, "qsgd", None, group="quantizer", op="decode"))  # decodes: not judged
    table = pd.DataFrame(rows)
    line = _cuda_goals(table)[-1]
    assert "nothing read back while an encode is queued" in line and line.endswith("| yes |")
    assert "0 of 6 rows synchronise; reading the payload back took 1 synchronisation(s) per call" in line
    table.loc[table["name"] == "sidco:dist=gamma,stages=3", "enqueue_syncs"] = 3
    line = _cuda_goals(table)[-1]
    assert line.endswith("| no |") and "1 of 6 rows synchronise: sidco:dist=gamma,stages=3" in line


def test_host_synchronisations_are_not_counted_off_cuda():
    assert host_syncs(lambda: torch.ones(3).sum(), "cpu") is None


@pytest.mark.cuda
def test_host_synchronisations_are_counted_on_cuda():
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    assert host_syncs(lambda: x.sum(), "cuda") == 0
    assert host_syncs(lambda: torch.nonzero(x > 500), "cuda") >= 1
    assert host_syncs(lambda: float(x.max()), "cuda") >= 1


def test_the_figure_of_a_cuda_run_plots_its_cuda_rows(tmp_path):
    """A run on CUDA has no one-thread rows: the figure shows the CUDA rows (an empty log axis raised before)."""
    rows = [
        {**_row(size, "cuda", 0.01, name, 1.0), "ms": ms, "ms_min": ms, "ms_max": ms}
        for size in (2_600_000, 26_000_000)
        for name, ms in (("torch.topk(|g|)", size / 4e7), ("sidco", size / 1e7))
    ]
    rows += [{**_row(s, "cuda", None, "g.sum() (one read pass)", None, group="read", op="read"), "ms": s / 2e8,
              "ms_min": s / 2e8, "ms_max": s / 2e8} for s in (2_600_000, 26_000_000)]  # fmt: skip
    files = plot(pd.DataFrame(rows), tmp_path)
    assert files["png"].stat().st_size > 0


def test_an_interrupted_run_judges_no_goal_but_shows_what_it_measured():
    """A goal over "every" row judged on the rows an interrupted run happens to hold would say yes on a part: the
    report keeps the measured values and judges none (the same table, not interrupted, judges them)."""
    from gradstat.analysis.bench._microbench_report import goals_markdown

    big = 26_000_000
    rows = [_row(big, "cuda", 0.01, n, goal, read_passes=1.0, ms=0.1) for n, goal in SIDCO_GOALS.items()]
    rows.append({**_row(big, "cuda", None, "g.sum() (one read pass)", None, group="read", op="read"), "GB/s": 2000.0})
    table = pd.DataFrame(rows)
    whole = goals_markdown(table)
    assert "| yes |" in whole
    table.attrs["interrupted"] = True
    partial = goals_markdown(table)
    assert "| yes |" not in partial and "| no |" not in partial
    assert partial.count("| not judged (run interrupted) |") == whole.count("| yes |") + whole.count("| no |")
    assert "3.00x" in partial and "**Interrupted:**" in partial
