"""The counter-hash draws that replace torch's per-device generator: random-k's subset (``counter_dither.subset``,
drawn by ``randk`` and ``randk_unbiased``: k distinct indices, every k-subset equally likely, ``randk_unbiased``
unbiased), DGC's sample with replacement (``counter_dither.indices``: uniform) and Wangni's keep coins
(``wangni.coins``: each element kept with its probability). Each statistical check at a stated confidence with fixed
seeds, and each shown to fail on a planted bug."""

from __future__ import annotations

import math
from collections import Counter
from itertools import combinations
from statistics import NormalDist
from typing import Callable

import pytest
import torch
from _no_host_reads import host_reads
from scipy import stats

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers import randk, wangni
from gradstat.compressors.wire.errors import PayloadError
from gradstat.theory.kernels import bounded, counter_dither, counter_native, native

CONFIDENCE = 0.999
Draw = Callable[[int, int, int], torch.Tensor]


def drawn(d: int, k: int, seed: int) -> torch.Tensor:
    return randk.random_subset(d, k, seed, "cpu")


def coarse_hash(d: int, k: int, seed: int) -> torch.Tensor:
    """Planted bug: the keys keep only the hash's top 4 bits, so ties (broken by index) favour low indices."""
    key = counter_dither.keys(seed, randk.SUBSET_STREAM, "cpu")
    h = counter_dither.counter_bits(1, d, torch.zeros((), dtype=torch.int32), key, torch.device("cpu")).reshape(-1)
    order = ((h.to(torch.int64) + (1 << 31)) >> 28 << 31) + torch.arange(d)
    return (torch.topk(order, k, largest=False).values & ((1 << 31) - 1)).sort().values


def never_last(d: int, k: int, seed: int) -> torch.Tensor:
    """Planted bug: an off-by-one that never draws the last element."""
    return randk.random_subset(d - 1, k, seed, "cpu")


def subset_chi_square(draw: Draw, d: int, k: int, trials: int) -> tuple[float, float]:
    """Pearson's statistic of the subsets ``draw`` gives over seeds ``0 .. trials - 1`` against the uniform law on
    all C(d, k) subsets, and its critical value at CONFIDENCE (C(d, k) - 1 degrees of freedom)."""
    counts = Counter(tuple(draw(d, k, seed).tolist()) for seed in range(trials))
    cells = list(combinations(range(d), k))
    assert set(counts) <= set(cells)
    expected = trials / len(cells)
    statistic = sum((counts.get(c, 0) - expected) ** 2 / expected for c in cells)
    return statistic, float(stats.chi2.ppf(CONFIDENCE, len(cells) - 1))


def inclusion_chi_square(draw: Draw, d: int, k: int, trials: int) -> tuple[float, float]:
    """Pearson's statistic of how often each index is drawn (expected ``trials k / d`` each) and its critical value
    at CONFIDENCE (d - 1 degrees of freedom: the counts sum to trials k)."""
    counts = torch.zeros(d)
    for seed in range(trials):
        counts[draw(d, k, seed)] += 1
    expected = trials * k / d
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return statistic, float(stats.chi2.ppf(CONFIDENCE, d - 1))


def test_a_subset_is_k_distinct_increasing_indices_in_range():
    for d, k, seed in [(1, 1, 0), (10, 10, 1), (1000, 1, 2), (100_003, 1000, 3), (5, 0, 4)]:
        s = drawn(d, k, seed)
        assert s.dtype == torch.int64 and s.numel() == k
        assert bool((s[1:] > s[:-1]).all()) and (k == 0 or (0 <= int(s[0]) and int(s[-1]) < d))


def test_a_subset_of_more_elements_than_there_are_is_refused():
    with pytest.raises(ValueError, match="subset of 6 elements of 5"):
        counter_dither.subset(5, 6, counter_dither.keys(0, 5, "cpu"), "cpu")


@pytest.mark.parametrize("draw,uniform", [(drawn, True), (never_last, False), (coarse_hash, False)])
def test_every_subset_is_equally_likely(draw, uniform):
    statistic, critical = subset_chi_square(draw, d=6, k=3, trials=3000)  # 20 subsets, 150 expected each
    assert (statistic <= critical) == uniform, (statistic, critical)


@pytest.mark.parametrize("draw,uniform", [(drawn, True), (coarse_hash, False)])
def test_every_index_of_a_long_vector_is_drawn_equally_often(draw, uniform):
    statistic, critical = inclusion_chi_square(draw, d=2000, k=20, trials=2000)  # 20 draws of each index expected
    assert (statistic <= critical) == uniform, (statistic, critical)


def _projection_z(scale: float, trials: int = 1500) -> float:
    """z statistic of the Monte Carlo mean of ``<C(g), g> / ||g||^2`` against 1 (randk_unbiased's expectation), the
    decoded values multiplied by ``scale`` (1: as sent; other values plant a biased reconstruction)."""
    c = compressors.create("randk_unbiased:ratio=0.1")
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(200, generator=gen, dtype=torch.float64).float()
    norm2 = float((g.double() ** 2).sum())
    samples = torch.tensor(
        [float((c(g, Context(seed=seed)).double() * scale * g.double()).sum()) / norm2 for seed in range(trials)],
        dtype=torch.float64,
    )
    return float((samples.mean() - 1.0) / (samples.std() / math.sqrt(trials)))


@pytest.mark.parametrize("scale,unbiased", [(1.0, True), (20 / 21, False)])  # d/(k+1) in place of d/k: biased
def test_randk_unbiased_is_unbiased(scale, unbiased):
    critical = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)  # two-sided, 99.9 %
    assert (abs(_projection_z(scale)) <= critical) == unbiased


def _with_replacement(d: int, seed: int, n: int, width: int) -> torch.Tensor:
    """``n`` counter indices drawn into ``range(width)`` (``width = d`` as DGC draws; ``d - 1`` plants an
    off-by-one that never draws the last index)."""
    return counter_dither.indices(n, width, counter_dither.keys(seed, 6, "cpu"), "cpu")


@pytest.mark.parametrize("width_shift,uniform", [(0, True), (-1, False)])
def test_indices_with_replacement_are_uniform(width_shift, uniform):
    d, n = 50, 20_000  # 400 draws of each index expected
    counts = torch.bincount(_with_replacement(d, 3, n, d + width_shift), minlength=d).double()
    assert int(counts.sum()) == n and counts.numel() == d
    statistic = float(((counts - n / d) ** 2 / (n / d)).sum())
    assert (statistic <= stats.chi2.ppf(CONFIDENCE, d - 1)) == uniform, statistic


def test_indices_with_replacement_stay_in_range_at_the_extremes():
    for d in (1, 2, 3, 2**31 - 1):
        got = counter_dither.indices(10_000, d, counter_dither.keys(1, 6, "cpu"), "cpu")
        assert int(got.min()) >= 0 and int(got.max()) < d


def _by_definition(d: int, k: int, seed: int) -> torch.Tensor:
    """The subset as specified: the k elements of smallest (hash as a signed int32, index) pair, increasing."""
    key = counter_dither.keys(seed, randk.SUBSET_STREAM, "cpu")
    h = counter_dither.counter_bits(1, d, torch.zeros((), dtype=torch.int32), key, torch.device("cpu")).reshape(-1)
    pairs = sorted(zip(h.tolist(), range(d), strict=True))[:k]
    return torch.tensor(sorted(i for _, i in pairs), dtype=torch.int64)


@pytest.mark.parametrize("path", ["C loop", "C loop, small buffers", "torch chunks"])
@pytest.mark.parametrize("chunk,sigmas", [(None, None), (1000, None), (1000, -50.0)])
def test_the_cpu_cut_and_chunks_give_the_subset_of_the_definition(monkeypatch, native_split, path, chunk, sigmas):
    """The cut gives the definition's subset, its candidates found by gradstat's C loop (in one piece or three, and
    with buffers of 64 that each piece outgrows and fills again: for k = 40 of 20,000, more than k but fewer than
    all the candidates fit) or by the torch hash in chunks (boundaries every
    1000 elements); a cut that passes fewer than k elements (a margin of -50 sigmas) falls back to the full sort,
    with the same result."""
    if path == "torch chunks":
        monkeypatch.setenv("GRADSTAT_COMPILE", "never")  # (no C loop)
    elif not native.built():
        pytest.skip("the C extension is absent (installed without a C compiler)")
    calls: list[int] = []
    below = counter_native.hashes_below
    shrink = path == "C loop, small buffers"
    monkeypatch.setattr(
        counter_native,
        "hashes_below",
        lambda d, cut, key, expected: calls.append(d) or below(d, cut, key, 0 if shrink else expected),
    )
    if chunk is not None:
        monkeypatch.setattr(counter_dither, "CHUNK_ELEMENTS", chunk)
    if sigmas is not None:
        monkeypatch.setattr(counter_dither, "SUBSET_MARGIN_SIGMAS", sigmas)
    for d, k, seed in [(20_000, 200, 1), (20_011, 3, 2), (5_000, 4_990, 3), (70_001, 700, 4), (20_000, 40, 5)]:
        assert torch.equal(drawn(d, k, seed), _by_definition(d, k, seed)), (d, k)
    assert bool(calls) == (path != "torch chunks")  # (the C loop ran where it is meant to)


@pytest.mark.parametrize("form", ["eager", "triton"])
def test_the_bounded_subset_gives_the_subset_of_the_definition(form, monkeypatch):
    """bounded.random_subset (the form a GPU takes: the keys hashed in one pass, those past the cut's key selected
    into a buffer, ranked on their hashes): the definition's subset wherever its condition holds, at many sizes,
    densities and seeds; its Triton keys (interpreted here) or eager ones."""
    if form == "triton":
        if not counter_dither.triton_runtime.available():
            pytest.skip("no Triton 3.0 or newer here")
        monkeypatch.setattr(counter_dither, "triton_for", lambda name, out, blocks, rows, rest=(): name == (
            "hash_keys_into") and counter_dither.triton_dither.applies(name, out, blocks, rows, rest))  # fmt: skip
    cases = [(20_000, 200, 1), (20_011, 3, 2), (5_000, 4_990, 3), (70_001, 700, 4), (200_000, 1, 5), (9, 2, 6)]
    for d, k, seed in cases:
        key = counter_dither.keys(seed, randk.SUBSET_STREAM, "cpu")
        got, holds = bounded.random_subset(d, k, key, "cpu")
        assert bool(holds), (d, k)
        assert torch.equal(got, _by_definition(d, k, seed)), (d, k)


def test_the_bounded_subset_on_every_device_gives_the_subset_of_the_definition(device):
    """bounded.random_subset where it runs (the Triton keys and selection on CUDA, eager forms on a CPU): the
    definition's subset, computed on the CPU, and its condition true."""
    for d, k, seed in [(20_000, 200, 1), (70_001, 700, 4), (300_000, 3_000, 8)]:
        key = counter_dither.keys(seed, randk.SUBSET_STREAM, device)
        got, holds = bounded.random_subset(d, k, key, device)
        assert got.device.type == device.type and bool(holds), (d, k)
        assert torch.equal(got.cpu(), _by_definition(d, k, seed)), (d, k)


@pytest.mark.parametrize("short", ["cut", "buffer"])
def test_the_bounded_subset_says_when_its_buffer_cannot_hold_the_answer(short, monkeypatch):
    """A cut that passes fewer than k elements (a margin of -50 sigmas), or a buffer smaller than what passes the
    cut, fails the condition; the indices stay within range all the same."""
    d, k, seed = 20_000, 200, 7
    if short == "cut":
        monkeypatch.setattr(counter_dither, "SUBSET_MARGIN_SIGMAS", -50.0)
    else:
        monkeypatch.setattr(counter_dither, "subset_room", lambda d, margin: k)
    got, holds = bounded.random_subset(d, k, counter_dither.keys(seed, randk.SUBSET_STREAM, "cpu"), "cpu")
    assert not bool(holds)
    assert got.numel() == k and int(got.min()) >= 0 and int(got.max()) < d


@pytest.mark.parametrize("fails", [False, True])
def test_random_k_takes_the_full_subset_where_the_bounded_one_fails(fails, monkeypatch):
    """Random-k off the CPU (the bounded form, taken here on CPU tensors): its encode, queued with the condition
    among its deferred checks (on a CPU under never), and its decode equal the full subset's, also where the
    condition fails (the encode then runs again synchronously and reads it back)."""
    from gradstat.theory.kernels.policy import forced

    g = torch.randn(20_000, generator=torch.Generator().manual_seed(3))
    with forced("never"):
        want = compressors.create("randk:ratio=0.01").encode(g, Context(seed=9))
        monkeypatch.setattr(randk, "bounded_form", lambda device: True)
        if fails:
            real = bounded.random_subset
            monkeypatch.setattr(bounded, "random_subset", lambda d, k, key, device: (
                real(d, k, key, device)[0].flip(0), torch.zeros((), dtype=torch.bool)))  # fmt: skip
        c = compressors.create("randk:ratio=0.01")
        pending = c.enqueue(g, Context(seed=9))
        assert not pending.settled  # (queued: the condition deferred)
        got = pending.payload()
        assert torch.equal(got["values"], want["values"])
        assert torch.equal(c.decode(got, Context(seed=9)), c.decode(want, Context(seed=9)))


@pytest.mark.parametrize("fails", [False, True])
def test_gmc_s_sample_takes_the_full_subset_where_the_bounded_one_fails(fails, monkeypatch):
    """GMC's sample without replacement off the CPU (the bounded subset, taken here on CPU tensors): its queued
    encode, the condition among the threshold's reads, gives the payload of the full subset's synchronous encode,
    also where the condition fails (then the indices given are shifted: another sample, another threshold, had the
    queued encode kept them)."""
    from gradstat.theory.kernels.policy import forced

    g = torch.randn(50_000, generator=torch.Generator().manual_seed(3))
    spec = "gmc_topk:ratio=0.01,sample_ratio=0.05"
    with forced("never"):
        want = compressors.create(spec).encode(g, Context(seed=9))
        monkeypatch.setattr(randk, "bounded_form", lambda device: True)
        if fails:
            real = bounded.random_subset
            monkeypatch.setattr(bounded, "random_subset", lambda d, k, key, device: (
                (real(d, k, key, device)[0] + 1) % d, torch.zeros((), dtype=torch.bool)))  # fmt: skip
        pending = compressors.create(spec).enqueue(g, Context(seed=9))
        assert not pending.settled  # (queued: the condition read back with the count)
        got = pending.payload()
    assert torch.equal(got["values"], want["values"]) and torch.equal(got["indices"], want["indices"])


@pytest.mark.parametrize("bounded_form", [False, True])
def test_random_k_decode_reads_back_once_and_refuses_values_that_are_not_finite(bounded_form, monkeypatch):
    """Random-k's decode reads the values' finiteness and, in the bounded form (taken here on CPU tensors), the
    bounded subset's condition in one read back; a value that is not finite raises PayloadError in either form. The
    C loops are off (GRADSTAT_COMPILE=never): on a CPU they read the key and the buffers' memory as numpy arrays,
    which a GPU's path never does."""
    monkeypatch.setattr(randk, "bounded_form", lambda device: bounded_form)
    monkeypatch.setenv("GRADSTAT_COMPILE", "never")
    c = compressors.create("randk:ratio=0.01")
    payload = c.encode(torch.randn(20_000, generator=torch.Generator().manual_seed(5)), Context(seed=4))
    with host_reads() as reads:
        out = c.decode(payload, Context(seed=4))
    assert reads[0] == 1
    assert int((out != 0).sum()) == payload["values"].numel()
    values = payload["values"].clone()
    values[3] = math.inf
    payload.parts["values"] = payload.parts["values"].__class__(values, 32, "value")
    with pytest.raises(PayloadError, match="NaN/Inf"):
        c.decode(payload, Context(seed=4))


def _unshifted_coins(p: torch.Tensor, seed: int) -> torch.Tensor:
    """Planted bug: the hash compared as a signed number (no 2^31 offset): kept with probability 1/2 + p/2."""
    key = counter_dither.keys(seed, wangni.COIN_STREAM, "cpu")
    h = counter_dither.counter_bits(1, p.numel(), torch.zeros((), dtype=torch.int32), key, torch.device("cpu"))
    return torch.nonzero(h.reshape(-1).double() < p.double() * 2.0**32).squeeze(1)


@pytest.mark.parametrize("coins,exact", [(wangni.coins, True), (_unshifted_coins, False)])
def test_wangni_s_coins_keep_each_element_with_its_probability(coins, exact):
    p = torch.cat([torch.tensor([0.0, 1.0]), torch.linspace(0.01, 0.99, 48)])
    trials = 4000
    kept = torch.zeros(p.numel(), dtype=torch.float64)
    for seed in range(trials):
        kept[coins(p, seed)] += 1
    rate = kept / trials
    if exact:
        assert rate[0] == 0.0 and rate[1] == 1.0
    inner = p[2:].double()
    z = (rate[2:] - inner) / torch.sqrt(inner * (1 - inner) / trials)
    critical = NormalDist().inv_cdf(1 - (1 - CONFIDENCE) / (2 * inner.numel()))  # two-sided, Bonferroni, 99.9 %
    assert bool((z.abs() <= critical).all()) == exact, float(z.abs().max())
