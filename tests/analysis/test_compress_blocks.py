"""``gradstat compress --blocks layer``: the layer-wise hook's blocks replayed rank by rank from a dump -- what is
written, what it equals where it can be computed by hand, and the combinations it refuses.

(Bit-for-bit agreement with a real 2-rank DDP run is in tests/distributed/test_parity.py.)"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from gradstat import compressors
from gradstat.analysis.cli.main import main
from gradstat.analysis.dumps import open_dump
from gradstat.compressors.context import Context


def run(*args: object) -> int:
    return main([*map(str, args)])


def test_blocks_layer_writes_one_row_per_step_worker_and_parameter(tiny_dump, tmp_path):
    out = tmp_path / "c"
    assert (
        run("compress", tiny_dump, "--blocks", "layer", "--compressor", "qsgd", "--feedback", "ef", "--out", out) == 0
    )
    dump = open_dump(tiny_dump)
    blocks = pd.read_csv(out / "compress_blocks.csv")
    assert len(blocks) == len(dump.steps) * dump.workers * len(dump.params)
    assert list(blocks.groupby(["step", "worker"])["param"].apply(list)) == [dump.params] * 6  # model order
    assert list(blocks["block"].unique()) == list(range(len(dump.params)))
    assert (blocks["wire_bytes"] > blocks["bits"] / 8).all()  # a header on every block
    ranks = pd.read_csv(out / "compress_ranks.csv")
    assert len(ranks) == len(dump.steps) * dump.workers
    assert ranks["bits"].sum() == blocks["bits"].sum() and (ranks["numel"] == dump.numel).all()
    # the dump's residual was left by whole-model Top-k: the same (zero) before step 0, another one afterwards
    assert blocks.query("step == 0")["residual_as_recorded"].all()
    assert not blocks.query("step > 0")["residual_as_recorded"].any()
    summary = pd.read_csv(out / "compress_summary.csv")
    assert summary.loc[0, "bits"] == pytest.approx(ranks["bits"].mean())
    assert summary.loc[0, "gain"] == pytest.approx(32 * dump.numel / ranks["bits"].mean())


def test_first_step_is_each_ranks_gradient_compressed_with_the_hooks_context(tiny_dump, tmp_path):
    """At step 0 the residual is zero, so worker w's block j is ``C(g)`` with ``Context(seed, 0, w, j)``."""
    out = tmp_path / "c"
    args = ["--compressor", "qsgd", "--feedback", "ef", "--seed", 3, "--steps", "0", "--save-decoded"]
    assert run("compress", tiny_dump, "--blocks", "layer", *args, "--out", out) == 0
    dump, qsgd = open_dump(tiny_dump), compressors.create("qsgd")
    blocks = pd.read_csv(out / "compress_blocks.csv").set_index(["worker", "block"])
    decoded = load_file(out / "decoded" / "step-0.safetensors")
    assert len(decoded) == dump.workers * len(dump.params)
    for w in range(dump.workers):
        for j, (name, g) in enumerate(dump.read(0, worker=w).items()):
            ctx = Context(seed=3, step=0, worker=w, block=j)
            payload = qsgd.encode(g, ctx)
            assert blocks.loc[(w, j), "bits"] == payload.bits
            assert blocks.loc[(w, j), "wire_bytes"] == payload.header_bits // 8 + math.ceil(payload.bits / 8)
            assert torch.equal(decoded[f"{w}/{name}"], qsgd.decode(payload, ctx))
    other = tmp_path / "other-seed"  # QSGD's rounding is seeded: another seed decodes otherwise
    assert run("compress", tiny_dump, "--blocks", "layer", *args, "--seed", 4, "--out", other) == 0
    assert not torch.equal(load_file(other / "decoded" / "step-0.safetensors")["0/fc1.weight"], decoded["0/fc1.weight"])


def test_a_replay_not_starting_at_step_0_warns_that_the_states_are_missing(tiny_dump, tmp_path, capsys):
    args = ["--compressor", "topk:ratio=0.1", "--feedback", "ef", "--steps", "1-2", "--out", tmp_path / "c"]
    assert run("compress", tiny_dump, "--blocks", "layer", *args) == 0
    assert "gradstat: warning: topk:ratio=0.1 with feedback ef: the replay starts with empty residuals" in (
        capsys.readouterr().err
    )


def test_a_stateless_replay_of_later_steps_does_not_warn(tiny_dump, tmp_path, capsys):
    args = ["--compressor", "qsgd", "--steps", "2", "--out", tmp_path / "c"]
    assert run("compress", tiny_dump, "--blocks", "layer", *args) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--blocks", "layer", "--per-layer"], "--per-layer compares"),
        (["--save-decoded"], "add --blocks layer"),
        (["--feedback", "dgc:momentum=0.9"], "--blocks layer only"),
        (["--blocks", "layer", "--feedback", "dgc:momentum=1.5"], "DGC momentum must lie in [0, 1)"),
        (["--blocks", "layer", "--feedback", "nope"], "unknown feedback"),
        (["--blocks", "layer", "--workers", "1"], "every rank"),
        (["--blocks", "layer", "--save-decoded", "--seeds", "2"], "--seeds 1 (got 2)"),
        (["--blocks", "layer", "--save-decoded", "--compressor", "topk:ratio=0.01"], "one --compressor (got 2)"),
        (["--blocks", "layer", "--compressor", "nosuch"], "unknown compressor 'nosuch'"),
    ],
)
def test_bad_combinations_are_one_line_and_exit_2(tiny_dump, tmp_path, capsys, args, message):
    assert run("compress", tiny_dump, "--compressor", "qsgd", *args, "--out", tmp_path / "x") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gradstat: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
