"""``gradstat import`` of several workers' gradients from one .pt or .npz file (layouts of data/README.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _dumpkit import PARAMS, make_grads

from gradstat.analysis.dumps import DumpError, open_dump
from gradstat.analysis.dumps.convert import import_dump

STEPS = [make_grads(s, workers=3) for s in range(2)]  # 2 steps x 3 workers of {param: tensor}


def assert_holds(path, steps: list[list[dict[str, torch.Tensor]]], numbers: list[int] | None = None) -> None:
    dump = open_dump(path)
    assert dump.workers == len(steps[0]) and dump.steps == (numbers or list(range(len(steps))))
    assert dump.params == [n for n, _ in PARAMS]
    for step, workers in zip(dump.steps, steps, strict=True):
        for w, grads in enumerate(workers):
            got = dump.read(step, w)
            for name, tensor in grads.items():
                assert torch.equal(got[name], tensor), (step, w, name)


def save_pt(tmp_path, obj):
    torch.save(obj, tmp_path / "g.pt")
    return tmp_path / "g.pt"


def test_list_of_lists_is_steps_of_workers(tmp_path):
    out = import_dump(save_pt(tmp_path, STEPS), tmp_path / "d")
    assert_holds(out, STEPS)


@pytest.mark.parametrize("as_str", [False, True])
def test_rank_dict_is_one_step_of_workers(tmp_path, as_str):
    obj = {(str(w) if as_str else w): g for w, g in enumerate(STEPS[0])}
    assert_holds(import_dump(save_pt(tmp_path, obj), tmp_path / "d"), STEPS[:1])


def test_list_of_rank_dicts_is_steps_of_workers(tmp_path):
    obj = [{w: g for w, g in enumerate(step)} for step in STEPS]
    assert_holds(import_dump(save_pt(tmp_path, obj), tmp_path / "d"), STEPS)


def test_step_dict_of_worker_lists_keeps_the_step_numbers(tmp_path):
    obj = {10: STEPS[0], 20: STEPS[1]}
    assert_holds(import_dump(save_pt(tmp_path, obj), tmp_path / "d"), STEPS, numbers=[10, 20])


def test_list_of_dicts_is_still_one_worker_per_step(tmp_path):
    obj = [STEPS[0][0], STEPS[1][0]]
    assert_holds(import_dump(save_pt(tmp_path, obj), tmp_path / "d"), [[obj[0]], [obj[1]]])


def test_npz_worker_keys_are_one_step_of_workers(tmp_path):
    arrays = {f"w{w}/{n}": t.numpy() for w, g in enumerate(STEPS[0]) for n, t in g.items()}
    np.savez(tmp_path / "g.npz", **arrays)
    assert_holds(import_dump(tmp_path / "g.npz", tmp_path / "d"), STEPS[:1])


def test_rank_dict_with_a_gap_is_refused(tmp_path):
    obj = {0: STEPS[0][0], 2: STEPS[0][1]}
    with pytest.raises(DumpError, match=r"holds worker ranks \[0, 2\], expected 0..1"):
        import_dump(save_pt(tmp_path, obj), tmp_path / "d")


def test_rank_dict_with_a_name_key_is_refused(tmp_path):
    obj = {0: STEPS[0][0], "model": STEPS[0][1]}
    with pytest.raises(DumpError, match="key 'model' is not a worker rank"):
        import_dump(save_pt(tmp_path, obj), tmp_path / "d")


def test_steps_with_different_worker_counts_are_refused(tmp_path):
    obj = [STEPS[0], STEPS[1][:2]]
    with pytest.raises(DumpError, match="expected 3 worker dicts, got 2"):
        import_dump(save_pt(tmp_path, obj), tmp_path / "d")


def test_workers_with_different_parameters_are_refused(tmp_path):
    bad = [STEPS[0][0], {"other": torch.ones(2)}]
    with pytest.raises(DumpError, match="worker 1: missing parameters"):
        import_dump(save_pt(tmp_path, [bad]), tmp_path / "d")


def test_mixed_list_is_refused_with_the_item(tmp_path):
    obj = [STEPS[0], torch.ones(3)]
    with pytest.raises(DumpError, match="step item 1 is Tensor"):
        import_dump(save_pt(tmp_path, obj), tmp_path / "d")
