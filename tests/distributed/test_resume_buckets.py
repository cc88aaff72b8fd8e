"""Resume across DDP's bucket rebuild (2 gloo ranks): a resumed DDP runs its first step on its initial buckets,
not on the rebuilt ones the checkpoint was saved with."""

from __future__ import annotations

import inspect
import math

import _scenarios
import pytest
import torch
from _ranks import run_ranks

PER_BUCKET_CAPS = "bucket_cap_mb_list" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
pytestmark = pytest.mark.skipif(not PER_BUCKET_CAPS, reason="needs DDP's bucket_cap_mb_list (per-bucket caps)")

# fc300 (parameters 0..5, 1.07 MB of gradients) with per-bucket caps of 1 MiB: DDP starts with two buckets,
# {0, 1, 2} and {3, 4, 5}, and rebuilds them into one after the first iteration of each DDP instance: the straight
# run and the resumed one (split at step 3) both start on two buckets
RUN = {"feedback": "ef", "iterations": 6, "split": 3, "caps": [1, 1]}
SCENARIOS = {
    "layer_sidco": ("checkpoint", {**RUN, "spec": "sidco:ratio=0.05,period=1", "granularity": "layer"}),
    "layer_qsgd": ("checkpoint", {**RUN, "spec": "qsgd", "granularity": "layer"}),
    "bucket_sidco": ("checkpoint", {**RUN, "spec": "sidco:ratio=0.05,period=1", "granularity": "bucket"}),
    "bucket_qsgd": ("checkpoint", {**RUN, "spec": "qsgd", "granularity": "bucket"}),
    "bucket_allreduce": (
        "checkpoint",
        {**RUN, "spec": "sidco:ratio=0.05,period=1", "granularity": "bucket", "exchange": "allreduce"},
    ),
    # six 256 x 256 layers, bucket_cap_mb=0.3: one initial bucket of all twelve parameters, three rebuilt ones of
    # four (the first resumed step runs the one, the checkpoint holds the three)
    **{
        f"deep_{spec.split(':')[0]}": (
            "resume_deep",
            {"spec": spec, "granularity": "bucket", "cap": 0.3, "iterations": 5, "split": 2},
        )
        for spec in ("sidco:ratio=0.05,period=1", "topk:ratio=0.01")
    },
    "fail": ("resume_then_fail", {"spec": "topk:ratio=0.01", "caps": [1, 1], "split": 2}),
}


@pytest.fixture(scope="module")
def resumed() -> dict:
    results = run_ranks(_scenarios.several, calls=SCENARIOS, timeout_s=400)
    out: dict = {}
    for name in SCENARIOS:
        for rank, res in enumerate(results):
            if "error" in res[name]:
                pytest.fail(f"scenario {name!r}: rank {rank} raised:\n{res[name]['error']}")
        out[name] = [res[name]["ok"] for res in results]
    return out


@pytest.mark.parametrize("name", ["layer_sidco", "layer_qsgd", "bucket_sidco", "bucket_qsgd"])
def test_resume_with_several_buckets_is_identical(resumed, name):
    for res in resumed[name]:
        # the run did use two buckets first and one after the rebuild; bucket-wise, the resumed first step was
        # compressed over the saved bucket {0, ..., 5}, not over DDP's initial two
        assert res["sigs"][0] == [[0, 1, 2], [3, 4, 5]] and res["sigs"][-1] == [[0, 1, 2, 3, 4, 5]]
        assert torch.equal(res["straight"], res["resumed"])
        assert res["warned"] == []


def test_a_resume_that_cannot_regroup_warns_that_it_is_not_identical(resumed):
    for res in resumed["bucket_allreduce"]:
        assert res["sigs"][0] == [[0, 1, 2], [3, 4, 5]] and res["sigs"][-1] == [[0, 1, 2, 3, 4, 5]]
        (message,) = res["warned"]
        assert "saved with 1 DDP bucket(s)" in message and "resumes identically" in message
        # what the warning says: the first resumed step compressed {0, 1, 2} and {3, 4, 5}, the straight run
        # {0, ..., 5}, so the models differ
        assert not torch.equal(res["straight"], res["resumed"])


def test_a_failure_in_the_regrouped_first_step_fails_every_rank_and_training_goes_on(resumed):
    for res in resumed["fail"]:
        assert res["nan"] is not None and "rank 1" in res["nan"] and "NaN" in res["nan"], res["nan"]
        assert isinstance(res["next_loss"], float) and math.isfinite(res["next_loss"])


@pytest.mark.parametrize("name", ["deep_sidco", "deep_topk"])
def test_resume_from_one_initial_bucket_onto_three_saved_ones_is_identical(resumed, name):
    three = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    for res in resumed[name]:
        assert res["used"][0] == [list(range(12))] and res["used"][1:] == [three] * 4
        assert res["used_resumed"][0] == three  # the first resumed step was compressed over the saved buckets
        assert torch.equal(res["straight"], res["resumed"]) and res["warned"] == []
