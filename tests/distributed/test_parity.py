"""Online/offline parity: what the DDP hook sent and decoded on 2 ranks is what the offline simulation computes
from the recorded dump.

Training runs with a layer-wise hook (one block per parameter, seed key = the parameter's position) and records
every step's local gradient of each rank (``worker = rank``) and its residual. Offline, the library's round with
feedback (:func:`gradstat.compressors.memory.send.feedback_round`, what ``record`` and the replays run) goes over the
dump with per-rank states and ``Context(seed, step, block = position)``; bits and decoded tensors must agree bit
for bit, for a deterministic compressor (Top-k), seeded randomized ones (QSGD, QCS) and a side-information scheme
(NDQSG, Algorithm 2 order), each with its feedback, and DGC's local momentum correction
(:class:`gradstat.compressors.memory.momentum.LocalMomentumCorrection`).

The same holds through the command a user runs: ``gradstat compress DUMP --blocks layer --compressor SPEC
--feedback FB --seed 5 --save-decoded`` writes the bits of every (step, worker, block) and the decoded tensors,
which equal the hook's bit for bit.
"""

from __future__ import annotations

import inspect

import _scenarios
import pandas as pd
import pytest
import torch
from _ranks import run_ranks
from safetensors.torch import load_file

from gradstat import compressors
from gradstat.analysis.cli.main import main
from gradstat.analysis.dumps import open_dump
from gradstat.compressors.context import Context
from gradstat.compressors.memory.momentum import LocalMomentumCorrection
from gradstat.compressors.memory.send import feedback_round, new_worker_states
from gradstat.compressors.schemes.dense import SmallDense

ITERATIONS = 4
SEED = 5  # the seed _scenarios.record_and_keep trains with
RUNS = [
    ("topk:ratio=0.1", "ef"),
    ("qsgd", "ef"),
    ("qcs", "qcs:beta=0.5"),
    ("ndqsg", "none"),
    ("dgc:ratio=0.1", "dgc:momentum=0.9"),
    ("sidco:ratio=0.1,period=1", "ef"),  # its stage count adapts every step: a state that must survive the rebuild
    ("topk:ratio=0.05", "ef"),  # keeps < 1 of the 10-element bias: sent dense
    ("powersgd", "ef"),  # each matrix by its factors, the vectors dense
]
PER_BUCKET_CAPS = "bucket_cap_mb_list" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
CAPS = [1, 1] if PER_BUCKET_CAPS else None
"""DDP's per-bucket caps of the training runs: fc300's 1.07 MB of gradients start in two buckets, {0, 1, 2} and
{3, 4, 5}, rebuilt into one after the first iteration, so every run crosses a bucket rebuild (on a torch without
per-bucket caps, one bucket throughout)."""


@pytest.fixture(scope="module")
def online(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    runs = [(spec, fb, str(root / f"{i}-{spec.split(':')[0]}-{fb.split(':')[0]}")) for i, (spec, fb) in enumerate(RUNS)]
    kept = run_ranks(_scenarios.record_and_keep, runs=runs, iterations=ITERATIONS, caps=CAPS, timeout_s=300)
    return {spec: (dump, kept[0][spec], kept[1][spec]) for spec, _, dump in runs}


@pytest.mark.parametrize("spec,feedback", RUNS)
def test_hook_payloads_equal_the_offline_replay_of_the_recorded_dump(online, spec, feedback):
    dump_path, seen0, seen1 = online[spec]
    # both ranks decoded the same messages (every rank decodes every rank's payload)
    assert seen0.keys() == seen1.keys()
    for key in seen0:
        assert seen0[key][0] == seen1[key][0] and torch.equal(seen0[key][1], seen1[key][1])
    dump = open_dump(dump_path)
    assert dump.workers == 2 and dump.steps == list(range(ITERATIONS))
    comp = SmallDense(compressors.create(spec))  # as the hook runs it: what it does not compress goes dense
    dgc = LocalMomentumCorrection(comp, momentum=0.9) if feedback.startswith("dgc") else None
    fb = compressors.parse_feedback("ef" if dgc else feedback)
    names = dump.params
    states = {i: dgc.new_states(2) if dgc else new_worker_states(comp, 2) for i in range(len(names))}
    compared = 0
    for step in dump.steps:
        grads = [dump.read(step, worker=r) for r in range(2)]
        residuals = [dump.read_extra("residual", step, worker=r) for r in range(2)]
        for i, name in enumerate(names):
            for r in range(2):  # the recorded residual is the offline memory before this step
                offline = states[i][r].feedback.residual
                expected = torch.zeros_like(residuals[r][name]) if offline is None else offline
                assert torch.equal(residuals[r][name], expected), f"{spec} step {step} rank {r} {name}: residual"
            ctx = Context(seed=SEED, step=step, block=i)
            local = [g[name] for g in grads]
            result = dgc.round(local, states[i], ctx) if dgc else feedback_round(comp, fb, local, states[i], ctx)
            for r in range(2):
                bits, decoded = seen0[f"{step}/{r}/{i}"]
                assert bits == result.payloads[r].bits, f"{spec} step {step} rank {r} {name}: bits"
                assert torch.equal(decoded, result.decoded[r]), f"{spec} step {step} rank {r} {name}: decoded"
                compared += 1
    assert compared == ITERATIONS * 2 * len(names)


@pytest.mark.parametrize("spec,feedback", RUNS)
def test_gradstat_compress_blocks_layer_writes_the_payloads_the_hook_sent(online, spec, feedback, tmp_path):
    dump_path, seen, _ = online[spec]
    out = tmp_path / "replay"
    args = ["compress", dump_path, "--blocks", "layer", "--compressor", spec, "--feedback", feedback]
    assert main([*args, "--seed", str(SEED), "--save-decoded", "--quiet", "--out", str(out)]) == 0
    names = open_dump(dump_path).params
    blocks = pd.read_csv(out / "compress_blocks.csv")
    assert sorted(f"{s}/{w}/{b}" for s, w, b in zip(blocks.step, blocks.worker, blocks.block, strict=True)) == sorted(
        seen
    )
    # the residual before every step is the one the hook held (recorded), so z - z_hat agreed at every step
    assert blocks["residual_as_recorded"].dtype == bool and blocks["residual_as_recorded"].all()
    for row in blocks.itertuples():
        assert row.param == names[row.block]
        assert row.bits == seen[f"{row.step}/{row.worker}/{row.block}"][0], f"{spec} {row}: bits"
    ranks = pd.read_csv(out / "compress_ranks.csv")  # per step and rank: the sums the training log holds
    for row in ranks.itertuples():
        hook_bits = sum(seen[f"{row.step}/{row.worker}/{b}"][0] for b in range(len(names)))
        assert row.bits == hook_bits and row.blocks == len(names)
    for step in range(ITERATIONS):
        decoded = load_file(out / "decoded" / f"step-{step}.safetensors")
        assert sorted(decoded) == sorted(f"{r}/{name}" for r in range(2) for name in names)
        for r in range(2):
            for b, name in enumerate(names):
                hook = seen[f"{step}/{r}/{b}"][1]
                assert torch.equal(decoded[f"{r}/{name}"], hook), f"{spec} step {step} rank {r} {name}: decoded"


@pytest.mark.slow  # a torchrun launch (~25 s on 2 shared cores); the parity itself runs above on every suite
def test_train_then_compress_agree_from_the_files_alone(tmp_path):
    """What a user runs: ``gradstat train --granularity layer --record-every 1 --residual`` then ``gradstat
    compress --blocks layer`` on its dump with the run's seed; the run's blocks.csv and steps.csv hold the same
    bits and serialised bytes per (step, rank, block) and per (step, rank) as the replay's compress_blocks.csv and
    compress_ranks.csv, and the replay's residual before every step is the recorded one."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    dump, out = tmp_path / "D", tmp_path / "replay"
    train = [sys.executable, "-m", "gradstat", "train", "--workload", "fc300", "--nproc", "2", "--iterations", "3"]
    train += [
        "--compressor",
        "qsgd",
        "--feedback",
        "qcs:beta=0.2",
        "--granularity",
        "layer",
        "--record-every",
        "1",
        "--residual",
    ]
    train += ["--seed", "7", "--timeout", "60", "--out", str(dump)]
    proc = subprocess.run(train, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = [
        "compress",
        str(dump),
        "--blocks",
        "layer",
        "--compressor",
        "qsgd",
        "--feedback",
        "qcs:beta=0.2",
        "--seed",
        "7",
    ]
    assert main([*args, "--quiet", "--out", str(out)]) == 0
    hook = pd.read_csv(f"{dump}.train/blocks.csv").query("run == 'qsgd+qcs:beta=0.2'")
    replay = pd.read_csv(out / "compress_blocks.csv").rename(columns={"worker": "rank"})
    keys = ["step", "rank", "block"]
    both = hook.merge(replay, on=keys, suffixes=("_hook", "_replay"), validate="one_to_one")
    assert len(both) == len(hook) == len(replay) == 3 * 2 * 6
    for col in ("param", "bits", "wire_bytes"):
        assert (both[f"{col}_hook"] == both[f"{col}_replay"]).all(), col
    assert replay["residual_as_recorded"].dtype == bool and replay["residual_as_recorded"].all()
    steps = pd.read_csv(f"{dump}.train/steps.csv").query("run == 'qsgd+qcs:beta=0.2'")
    ranks = pd.read_csv(out / "compress_ranks.csv").rename(columns={"worker": "rank"})
    both = steps.merge(ranks, on=["step", "rank"], suffixes=("_hook", "_replay"), validate="one_to_one")
    assert len(both) == 3 * 2
    assert (both["bits_hook"] == both["bits_replay"]).all() and (
        both["wire_bytes_hook"] == both["wire_bytes_replay"]
    ).all()
