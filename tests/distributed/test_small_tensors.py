"""Small and odd tensors under the DDP hook (2 gloo ranks): a model with a 0-d scale, biases of 4 and 64 elements and
a 64-element norm trains layer-wise with every registered compressor; tensors a compressor cannot compress (a
sparsifier's ratio keeping < 1 element) or below the declared ``dense_below`` go dense, counted at their width."""

from __future__ import annotations

import dataclasses
import math

import _scenarios
import pytest
import torch
from _ranks import run_ranks

from gradstat import compressors
from gradstat.compressors.schemes.dense import Dense, SmallDense
from gradstat.theory.kernels import policy

ITERATIONS = 4
GLOO_BF16 = policy.torch_version() >= (2, 9)
"""Whether the bf16 model runs under gloo here: checked from torch 2.9 (2.13 and 2.14 pass); torch 2.1's gloo
cannot broadcast bfloat16 parameters (DDP's first sync raises "Invalid scalar type" and leaves the group unusable
for the scenarios after it)."""
SPECS = compressors.names()


@pytest.fixture(scope="module")
def layerwise() -> list[dict]:
    calls = {
        "layer": ("tiny_tensors", {"specs": SPECS, "feedback": "ef", "iterations": ITERATIONS}),
        # every parameter below 100 elements dense, also for compressors that could compress them
        "declared": ("tiny_tensors", {"specs": ["qsgd"], "feedback": "ef", "iterations": 2, "dense_below": 100}),
        # the bucket path: TinyTensors' one bucket of 5,637 elements, where ratio 1e-4 keeps < 1 element
        "bucket": (
            "tiny_tensors",
            {"specs": ["topk:ratio=0.0001"], "feedback": "ef", "iterations": 2, "granularity": "bucket"},
        ),
    }
    if GLOO_BF16:
        calls["bf16"] = (
            "tiny_tensors",
            {"specs": ["topk", "qsgd"], "feedback": "ef", "iterations": 2, "dtype": "bfloat16"},
        )
    results = run_ranks(_scenarios.several, calls=calls, timeout_s=400)
    for rank, res in enumerate(results):
        for name, out in res.items():
            if "error" in out:
                pytest.fail(f"scenario {name!r}: rank {rank} raised:\n{out['error']}")
    return [
        {
            **res["layer"]["ok"],
            "declared": res["declared"]["ok"]["qsgd"],
            "bucket": res["bucket"]["ok"]["topk:ratio=0.0001"],
            "bf16": res["bf16"]["ok"] if GLOO_BF16 else None,
        }
        for res in results
    ]


@pytest.mark.parametrize("name", SPECS)
def test_a_model_with_tiny_tensors_trains_layerwise_with_every_compressor(layerwise, name):
    comp = compressors.create(name)
    for rank, res in enumerate(layerwise):
        run = res[name]
        assert len(run["losses"]) == ITERATIONS and all(math.isfinite(x) for x in run["losses"]), run["losses"]
        assert run["params_finite"], f"rank {rank}: a parameter is not finite"
        # what goes dense, derived here from the spec, not from the compressor's own rule: a sparsifier's tensors
        # whose d * ratio keeps < 1 element; PowerSGD's (rank r) vectors and matrices whose factors are not 2x
        # smaller than the matrix (torch's PowerSGD hook's rule: 2 r (n + m) >= n m); nothing else
        small = [pos for pos, shape in run["shapes"].items() if _expected_dense(comp, tuple(shape))]
        if "ratio" in {f.name for f in dataclasses.fields(comp)}:  # the case: norms and biases of < 100
            assert sorted(run["sizes"][pos] for pos in small) == [1, 4, 64, 64, 64, 64]
        # every step sends exactly those tensors dense, and says how many
        assert run["dense"] == [len(small)] * ITERATIONS
        for pos in small:
            numel, bits = run["sent"][pos]
            assert numel == run["sizes"][pos] and bits == 32 * numel  # float32 values, nothing else
            # dense is exact: what the receivers decoded is this rank's gradient (the residual of a dense block is 0)
            assert torch.equal(run["decoded"][pos].reshape(-1), run["local"][pos].reshape(-1))
    # both ranks applied the same averaged gradients
    assert torch.equal(layerwise[0][name]["final"], layerwise[1][name]["final"])


def _expected_dense(comp: compressors.Compressor, shape: tuple[int, ...]) -> bool:
    ratio = getattr(comp, "ratio", None)
    if ratio is not None:
        return math.prod(shape) * ratio < 1
    if comp.name == "powersgd":
        if len(shape) < 2:
            return True
        n, m = shape[0], math.prod(shape[1:])
        return 2 * comp.rank * (n + m) >= n * m
    return False


def test_a_declared_size_sends_every_smaller_tensor_dense(layerwise):
    for res in layerwise:
        run = res["declared"]  # qsgd, dense_below=100: the 0-d scale, the biases of 4 and 64 and the norm's 64 + 64
        assert run["dense"] == [6, 6]
        for pos, n in run["sizes"].items():
            numel, bits = run["sent"][pos]
            if n < 100:
                assert bits == 32 * n
            else:
                assert bits < 32 * n  # compressed by qsgd


def test_sparsifiers_send_the_papers_ratio_on_the_larger_tensors(layerwise):
    run = layerwise[0]["topk"]
    (weight,) = [pos for pos, n in run["sizes"].items() if n == 4096]
    # the 64 x 64 weight: k = ceil(0.01 * 4096) = 41 values of 32 bits and indices of ceil(log2 4096) = 12 bits
    assert run["sent"][weight] == (4096, 41 * (32 + 12))


def test_small_dense_picks_by_size_and_declared_threshold():
    topk = compressors.create("topk:ratio=0.01")
    codec = SmallDense(topk)
    assert codec.threshold == 100 and codec.sends_dense((99,)) and not codec.sends_dense((10, 10))
    assert SmallDense(compressors.create("qsgd")).threshold == 1
    assert SmallDense(compressors.create("qsgd"), dense_below=256).sends_dense((5, 51))
    # PowerSGD as torch's hook: vectors dense, and matrices whose rank-r factors are not 2 times smaller
    power = SmallDense(compressors.create("powersgd:rank=2"))
    assert power.sends_dense((1000,)) and power.sends_dense((8, 8)) and not power.sends_dense((9, 9, 1))
    assert not SmallDense(compressors.create("powersgd:matrices=bucket")).sends_dense((1000,))
    with pytest.raises(ValueError, match="dense_below must be an integer >= 0"):
        SmallDense(topk, dense_below=-1)
    g = torch.randn(64, dtype=torch.bfloat16)
    p = codec.encode(g)
    assert p.bits == 16 * 64 and torch.equal(codec.decode(p), g) and codec.decode(p).dtype == torch.bfloat16
    big = torch.randn(1000)
    assert codec.encode(big).bits == topk.encode(big).bits


def test_dense_round_trips_through_bytes_at_the_gradient_width():
    from gradstat.compressors.wire.payload import Payload

    for dtype, width in ((torch.float32, 32), (torch.float16, 16), (torch.bfloat16, 16), (torch.float64, 64)):
        g = torch.randn(3, 5, dtype=dtype)
        p = Dense().encode(g)
        back = Payload.from_bytes(p.to_bytes(), p.shape, p.dtype)
        assert p.bits == width * 15 and torch.equal(Dense().decode(back), g)


def test_min_numel_is_the_smallest_vector_a_ratio_keeps_one_element_of():
    for ratio, d in ((0.01, 100), (0.3, 4), (0.07, 15), (0.5, 2)):
        c = compressors.create(f"topk:ratio={ratio}")
        assert c.min_numel() == d
        c.encode(torch.randn(d))  # accepted
        with pytest.raises(ValueError, match="< 1 element"):
            c.encode(torch.randn(d - 1))
    assert compressors.create("qsgd").min_numel() == 1


def test_a_bf16_model_sends_its_values_and_scales_at_16_bits(layerwise):
    if not GLOO_BF16:
        pytest.skip(f"bf16 under gloo is checked from torch 2.9 (this is {torch.__version__})")
    for res in layerwise:
        topk, qsgd = res["bf16"]["topk"], res["bf16"]["qsgd"]
        assert all(math.isfinite(x) for x in topk["losses"] + qsgd["losses"])
        for pos, n in topk["sizes"].items():
            numel, bits = topk["sent"][pos]
            k = math.ceil(0.01 * n)
            # below 100 elements dense at 16 bits; above, k values of 16 bits and indices of ceil(log2 n) bits
            assert bits == (16 * n if n < 100 else k * (16 + math.ceil(math.log2(n)))), (pos, n, bits)
        for pos, n in qsgd["sizes"].items():
            numel, bits = qsgd["sent"][pos]
            # qsgd (s=4, buckets of 512): codes of ceil(log2 9) = 4 bits, one 16-bit scale per bucket
            assert bits == 4 * n + 16 * math.ceil(n / 512), (pos, n, bits)


def test_a_bucket_the_compressor_cannot_compress_goes_dense(layerwise):
    for res in layerwise:
        run = res["bucket"]
        total = sum(run["sizes"].values())
        assert total == 5637 and run["dense"] == [1, 1]
        ((numel, bits),) = run["sent"].values()
        assert numel == total and bits == 32 * total
        assert all(math.isfinite(x) for x in run["losses"])
