"""The counter-based dither (theory/kernels/counter_dither.py): the compiled fused quantizer equals the eager
reference bit for bit; compiling degrades to eager (switched off, or failing); the numbers are uniform on [0, 1) (KS
test) and make DQSG's error exactly uniform (Lemma 3) and QSGD unbiased; the same seed gives the same numbers on CPU
and CUDA."""

from __future__ import annotations

import pytest
import torch
from _quant_checks import check_mean_equals, check_unbiased, draws, laplace
from scipy import stats

from gradstat.compressors import Context, create
from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.dqsg import conditional_error
from gradstat.theory.kernels import counter_dither, counter_native, nested
from gradstat.theory.kernels.policy import can_compile

needs_compiler = pytest.mark.skipif(not can_compile(), reason="no C++ compiler for torch.compile here")


@pytest.fixture
def eager(monkeypatch):
    """Eager torch only (the reference; statistical tests need no compiler)."""
    monkeypatch.setenv("GRADSTAT_COMPILE", "0")


def _uniforms(n: int, seed: int, base: int = 0) -> torch.Tensor:
    key = counter_dither.keys(seed, 1, "cpu")
    dither = counter_dither.dither_rows(1, n, torch.tensor(base, dtype=torch.int32), key, torch.device("cpu"))[0]
    return dither + 0.5  # in [0, 1): exact (multiples of 2^-24)


def test_counter_uniforms_pass_a_kolmogorov_smirnov_test_at_99_9_percent():
    for seed in (0, 1):
        u = _uniforms(1 << 18, seed).double()
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        assert stats.kstest(u.numpy(), "uniform").pvalue > 0.001
        # consecutive counters are not correlated (lag-1 Pearson r, |z| below 3.29 = 99.9 % two-sided)
        r = torch.corrcoef(torch.stack((u[:-1], u[1:])))[0, 1]
        assert abs(float(r)) * (u.numel() ** 0.5) < 3.29


def _chi2_uniform_pvalue(cells: torch.Tensor, bins: int) -> float:
    counts = torch.bincount(cells, minlength=bins).double().numpy()
    return float(stats.chisquare(counts).pvalue)


def test_pairs_and_low_bits_of_the_counter_uniforms_are_uniform_at_99_9_percent():
    """Beyond the marginal: neighbours (u_i, u_i+1), the same index under two seeds, and elements 2^k apart fall
    uniformly on a 16 x 16 grid, and the lowest 8 of the 24 bits are uniform over their 256 values (chi-square,
    each test at 99.9 %; 2^18 pairs, ~1000 per cell)."""
    n = 1 << 18
    u, v = _uniforms(n + 4096, 7), _uniforms(n, 8)
    cell = (u * 16).long()
    pairs = {
        "neighbours": cell[:n] * 16 + cell[1 : n + 1],
        "two seeds": cell[:n] * 16 + (v * 16).long(),
        "4096 apart": cell[:n] * 16 + cell[4096 : n + 4096],
    }
    for name, cells in pairs.items():
        assert _chi2_uniform_pvalue(cells, 256) > 0.001, name
    low = (u * 2**24).long() & 0xFF
    assert _chi2_uniform_pvalue(low, 256) > 0.001


def test_the_stream_depends_on_the_seed_and_on_the_index_only():
    a, b = _uniforms(4096, 5), _uniforms(4096, 6)
    assert (a == b).double().mean() < 0.01
    assert torch.equal(_uniforms(4096, 5)[100:], _uniforms(3996, 5, base=100))


def test_uniforms_are_multiples_of_2_to_the_minus_24():
    u = _uniforms(10_000, 3).double()
    assert torch.equal(u * 2**24, torch.round(u * 2**24))


@pytest.mark.parametrize("M,K", [(1, 1), (2, 3)])
def test_dqsg_with_counter_dither_has_the_exact_uniform_error(eager, M, K):
    c = create(f"dqsg:M={M},partitions={K},dither=counter")
    g = laplace(2000, 10 + M)
    size = -(-g.numel() // K)
    exact = sum(conditional_error(part.double().numpy(), c.delta) for part in g.split(size))
    errs = ((draws(c, g, 400) - g.double()) ** 2).sum(1)
    assert check_mean_equals(errs, exact) == []


def test_qsgd_with_counter_dither_is_unbiased(eager):
    assert check_unbiased(create("qsgd:s=2,bucket=100,dither=counter"), laplace(1000, 4), trials=400) == []


@pytest.mark.parametrize("name", ["qsgd", "terngrad", "ecq", "dqsg", "qcs"])
def test_the_default_is_the_counter_dither_and_torch_s_generator_remains_an_option(eager, name):
    g = laplace(3000, 1)
    default, counter, plain = create(name), create(f"{name}:dither=counter"), create(f"{name}:dither=torch")
    assert default.dither == "counter" and torch.equal(default.encode(g)["codes"], counter.encode(g)["codes"])
    assert not torch.equal(plain.encode(g)["codes"], counter.encode(g)["codes"])


QUANTIZERS = [
    ScaledQuantizer(levels=4, bucket=512, norm="l2", subtract=False, dither="counter"),
    ScaledQuantizer(levels=2, bucket=0, norm="linf", subtract=True, dither="counter"),
    ScaledQuantizer(levels=1, bucket=64, norm="linf", subtract=True, onebit=True, dither="counter"),
]


def _round_trip(q: ScaledQuantizer, x: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    p = Payload(shape=x.shape, dtype=x.dtype)
    q.encode(x, p, seed)
    return p["codes"], q.decode(p, x.numel(), seed)


def _fresh_kernels(monkeypatch) -> None:
    """Kernels with no build yet and no failure remembered (each test starts from a clean process state), and
    the C loops off, so that the compiled kernels are what runs."""
    for kernel in counter_dither.KERNELS.values():
        monkeypatch.setattr(kernel, "_compiled", None)
        monkeypatch.setattr(kernel, "_broken", False)
    _no_c_loops(monkeypatch)


def _no_c_loops(monkeypatch) -> None:
    for name in ("quantizes", "reconstructs", "nests"):
        monkeypatch.setattr(counter_native, name, lambda *a: False)


def _record_calls(monkeypatch, *names: str) -> list[str]:
    """The names of the ``counter_native`` functions called from now on, in order (each still runs)."""
    calls: list[str] = []
    for name in names:
        real = getattr(counter_native, name)
        monkeypatch.setattr(counter_native, name, lambda *a, _real=real, _n=name: calls.append(_n) or _real(*a))
    return calls


def _nested_round_trips(monkeypatch, spec: str, modes: tuple[str, ...], n: int, noise: float, seed: int):
    """For each scale (1, 1e-30, 1e30, 0): NDQSG's nested worker's (codes, reconstruction) under each compile
    ``mode``, the side information ``noise`` times the scale away from the gradient."""
    c, ctx = create(spec), Context(seed=3, worker=1)
    gen = torch.Generator().manual_seed(seed)
    for scale in (1.0, 1e-30, 1e30, 0.0):
        g = torch.randn(n, generator=gen) * scale
        side = g + noise * scale * torch.randn(n, generator=gen)
        runs = []
        for mode in modes:
            monkeypatch.setenv("GRADSTAT_COMPILE", mode)
            p = c.encode(g, ctx)
            runs.append((p["nested"], c.decode(p, ctx, side=side)))
        yield scale, runs


needs_c_loops = pytest.mark.skipif(
    not counter_native.reconstructs(torch.zeros(1, dtype=torch.int8), torch.ones(1)),
    reason="the C extension is absent (installed without a C compiler)",
)


@needs_c_loops
@pytest.mark.parametrize("q", QUANTIZERS + [ScaledQuantizer(levels=2, bucket=3000, norm="linf", dither="counter")])
def test_c_loops_equal_eager_bit_for_bit(monkeypatch, q, native_split):
    """The C quantize and reconstruct loops against the eager reference tiles: codes and reconstructions bit for
    bit, for buckets split into full rows and a ragged last one, rows whose length is not a multiple of the
    8-element step, scales from 1e-30 to 1e30, several seeds; and they are what ran (a planted wrong call
    would not be caught otherwise)."""
    gen = torch.Generator().manual_seed(5)
    cases = [torch.randn(d, generator=gen) * s for d, s in ((5000, 1.0), (70_001, 1e-30), (4099, 1e30), (13, 1.0))]
    calls = _record_calls(monkeypatch, "quantize_rows_into", "reconstruct_rows_into")
    for i, x in enumerate(cases):
        monkeypatch.setenv("GRADSTAT_COMPILE", "auto")
        codes, out = _round_trip(q, x, seed=i)
        monkeypatch.setenv("GRADSTAT_COMPILE", "0")  # eager tiles (and no C loop)
        ref_codes, ref_out = _round_trip(q, x, seed=i)
        assert codes.dtype == ref_codes.dtype and torch.equal(codes, ref_codes), i
        assert torch.equal(out.view(torch.int32), ref_out.view(torch.int32)), i
    assert {"quantize_rows_into", "reconstruct_rows_into"} <= set(calls)  # (half-dithered decodes too)


@needs_c_loops
def test_c_sample_indices_equal_the_reference_tile(monkeypatch, native_split):
    """DGC's draws with replacement by the C loop (one piece, or three on the thread pool, each starting at its own
    counter) against the reference tile, element for element, for several seeds and lengths d up to 2^31 - 1 (the
    products near 2^63); and the loop is what ran."""
    calls = _record_calls(monkeypatch, "sample_indices_into")
    for seed in range(3):
        for n, d in ((1, 1), (9, 7), (200, 260_000), (1000, 2**31 - 1), (0, 5)):
            key = counter_dither.keys(seed, 6, "cpu")
            monkeypatch.setenv("GRADSTAT_COMPILE", "auto")
            drawn = counter_dither.indices(n, d, key, "cpu")
            monkeypatch.setenv("GRADSTAT_COMPILE", "0")  # the reference tile
            assert torch.equal(drawn, counter_dither.indices(n, d, key, "cpu")), (seed, n, d)
            assert drawn.dtype == torch.int64 and drawn.shape == (n,) and (n == 0 or 0 <= int(drawn.min()))
            assert n == 0 or int(drawn.max()) < d
    assert calls.count("sample_indices_into") == 15


@needs_c_loops
def test_half_dithered_c_decode_equals_the_torch_dither_decode(monkeypatch):
    """A half-dithered decode draws no dither: the C loop serves ``dither=torch`` payloads too, bit for bit."""
    q = ScaledQuantizer(levels=4, bucket=512, norm="l2", subtract=False, dither="torch")
    x = torch.randn(10_001, generator=torch.Generator().manual_seed(6))
    p = Payload(shape=x.shape, dtype=x.dtype)
    q.encode(x, p, 7)
    calls = _record_calls(monkeypatch, "reconstruct_rows_into")
    fast = q.decode(p, x.numel(), 7)
    assert calls  # the C loop is what ran
    _no_c_loops(monkeypatch)
    assert torch.equal(fast.view(torch.int32), q.decode(p, x.numel(), 7).view(torch.int32))


def _compiled_equals_eager(monkeypatch, quantizers: list[ScaledQuantizer], cases: list[torch.Tensor]) -> None:
    _fresh_kernels(monkeypatch)
    monkeypatch.setattr(counter_dither, "CHUNK_ELEMENTS", 1000)  # the eager path's tiles split rows and buckets
    kernel = counter_dither.KERNELS["quantize_rows_into"]
    for q in quantizers:
        for i, x in enumerate(cases):
            monkeypatch.setenv("GRADSTAT_COMPILE", "1")
            codes, out = _round_trip(q, x, seed=i)
            # the compiled path ran: built with fullgraph=True (a graph break would raise, fall back and mark it)
            assert kernel._compiled is not None and not kernel._broken
            monkeypatch.setenv("GRADSTAT_COMPILE", "0")
            ref_codes, ref_out = _round_trip(q, x, seed=i)
            assert codes.dtype == ref_codes.dtype and torch.equal(codes, ref_codes)
            assert torch.equal(out, ref_out)


@needs_compiler
def test_compiled_fused_quantizer_equals_eager_bit_for_bit(monkeypatch):
    """One compile per function (dynamic shapes): buckets of 3000 (the eager tiles of 1000 split them), full ones
    and a ragged last one, dither subtracted."""
    gen = torch.Generator().manual_seed(0)
    cases = [torch.randn(d, generator=gen) for d in (5000, 70_001)]
    q = ScaledQuantizer(levels=2, bucket=3000, norm="linf", subtract=True, dither="counter")
    _compiled_equals_eager(monkeypatch, [q], cases)


@needs_compiler
def test_compiled_nested_kernels_equal_eager_bit_for_bit(monkeypatch):
    """NDQSG's nested worker with the counter dither: the fused encode and decode (one compile each) give the eager
    tiles' codes and reconstructions at ordinary, tiny and huge scales and for an all-zero gradient (kappa = 0)."""
    for kernel in nested.NESTED_KERNELS:
        monkeypatch.setattr(kernel, "_compiled", None)
        monkeypatch.setattr(kernel, "_broken", False)
    _no_c_loops(monkeypatch)
    monkeypatch.setattr(counter_dither, "CHUNK_ELEMENTS", 1000)  # eager tiles split the vector
    for scale, runs in _nested_round_trips(monkeypatch, "ndqsg:alpha=0.7", ("1", "0"), 5001, 0.05, seed=2):
        assert all(k._compiled is not None and not k._broken for k in nested.NESTED_KERNELS)
        (codes, out), (ref_codes, ref_out) = runs
        assert torch.equal(codes, ref_codes) and torch.equal(out, ref_out), scale


@needs_compiler
def test_compiled_signed_rows_equal_eager_and_the_plain_signs(monkeypatch):
    """QCS's counter Rademacher signs applied in one fused pass: compiled and eager tiles give ``r * x / f`` bit
    for bit, with ``r`` the plain :func:`counter_dither.sign_rows` (+-1, about half each)."""
    kernel = counter_dither.KERNELS["signed_rows_into"]
    monkeypatch.setattr(kernel, "_compiled", None)
    monkeypatch.setattr(kernel, "_broken", False)
    monkeypatch.setattr(counter_dither, "CHUNK_ELEMENTS", 1000)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(37, 256, generator=gen) * torch.logspace(-30, 30, 37)[:, None]
    factor = torch.full((37, 1), 8.0**0.5)
    key, base = counter_dither.keys(9, 2, "cpu"), 512
    outs = []
    for mode in ("1", "0"):
        monkeypatch.setenv("GRADSTAT_COMPILE", mode)
        for divide in (True, False):
            out = torch.empty_like(x)
            outs.append(counter_dither.run_rows(counter_dither.signed_rows_into, out, x, factor, base, key, divide))
    assert kernel._compiled is not None and not kernel._broken
    r = counter_dither.sign_rows(37, 256, torch.tensor(base, dtype=torch.int32), key, torch.device("cpu"))
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[2], r * x / factor)  # compiled, eager: divided
    assert torch.equal(outs[1], outs[3]) and torch.equal(outs[3], r * x)  # and not
    assert set(r.unique().tolist()) == {-1.0, 1.0} and abs(float(r.mean())) < 4 / r.numel() ** 0.5  # 4 sigma


@needs_compiler
@pytest.mark.slow
def test_compiled_fused_quantizers_equal_eager_at_every_setting(monkeypatch):
    """Every kind of step (midtread half-dithered, dithered, 1-bit midrise), extreme scales, float64 input."""
    gen = torch.Generator().manual_seed(1)
    cases = [torch.randn(d, generator=gen) * s for d, s in ((5000, 1.0), (70_001, 1e-30), (1024, 1e30))]
    cases.append(torch.randn(3001, generator=gen, dtype=torch.float64))
    _compiled_equals_eager(monkeypatch, QUANTIZERS, cases)


def test_a_compiler_failure_falls_back_to_eager_with_a_warning(monkeypatch):
    _fresh_kernels(monkeypatch)
    monkeypatch.setenv("GRADSTAT_COMPILE", "1")

    def broken(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    x = laplace(3000, 2)
    with pytest.warns(RuntimeWarning, match="using eager torch"):
        codes, out = _round_trip(QUANTIZERS[1], x, seed=7)
    monkeypatch.setenv("GRADSTAT_COMPILE", "0")
    ref_codes, ref_out = _round_trip(QUANTIZERS[1], x, seed=7)
    assert torch.equal(codes, ref_codes) and torch.equal(out, ref_out)


def test_a_counter_beyond_int32_is_refused_with_a_clear_error():
    x = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="int32 counters"):
        counter_dither.run_rows(
            counter_dither.quantize_rows_into, torch.empty(1, 4, dtype=torch.int8), x, torch.ones(1, 1),
            2**31 - 2, counter_dither.keys(0, 1, "cpu"), 4.0, -4, 4, 0.5, torch.int8, compiled=False,
        )  # fmt: skip


@pytest.mark.cuda
def test_the_same_seed_gives_the_same_payload_on_cpu_and_cuda():
    g = laplace(100_003, 3)
    c = create("dqsg:M=2,dither=counter")
    on_cpu, on_gpu = c.encode(g, Context(seed=2)), c.encode(g.cuda(), Context(seed=2))
    assert torch.equal(on_cpu["codes"], on_gpu["codes"].cpu())
    assert torch.equal(c.decode(on_gpu, Context(seed=2)).cpu(), c.decode(on_cpu, Context(seed=2)))


@needs_c_loops
@pytest.mark.parametrize(
    "gain, lo, hi, shift, offset", [(3.0, -3, 3, 0.5, 0.0), (0.5, -1, 0, 0.0, 0.5), (7.0, -7, 7, 0.5, 0.0)]
)
def test_c_loops_equal_the_plain_row_functions_with_clamping_and_any_gain(gain, lo, hi, shift, offset):
    """The C loops called directly against :func:`counter_dither.quantize_rows` and ``reconstruct_rows``: gains
    that are not powers of two (so ``x / s * gain`` and ``x * gain / s`` differ), scales below the values (the
    clamp to [lo, hi] active at both ends), rows whose length is not a multiple of 8, a nonzero base index."""
    gen = torch.Generator().manual_seed(9)
    key = counter_dither.keys(4, 1, "cpu")
    for rows, size, base in ((3, 1001, 0), (7, 64, 12345), (1, 5, 2**30)):
        x = torch.randn(rows, size, generator=gen) * torch.logspace(-20, 20, rows)[:, None]
        scale = x.abs().amax(dim=1, keepdim=True) * torch.tensor([0.2, 1.0, 3.0] * 3)[:rows, None]
        b = torch.tensor(base, dtype=torch.int32)
        want = counter_dither.quantize_rows(x, scale, b, key, gain, lo, hi, shift, torch.int8)
        assert (want == lo).any() and (want == hi).any() if rows > 1 else True
        codes = counter_native.quantize_rows_into(torch.empty_like(want), x, scale, base, key, gain, lo, hi, shift)
        assert torch.equal(codes, want), (rows, size)
        for subtract in (True, False):
            ref = counter_dither.reconstruct_rows(want, scale, b, key, gain, offset, subtract)
            out = counter_native.reconstruct_rows_into(
                torch.empty_like(ref), want, scale, base, key, gain, offset, subtract
            )
            assert torch.equal(out.view(torch.int32), ref.view(torch.int32)), (rows, size, subtract)


@needs_c_loops
@pytest.mark.parametrize("spec", ["ndqsg", "ndqsg:alpha=0.7", "ndqsg:delta1=0.2,delta2=1.4", "ndqsg:delta1=0.25"])
def test_c_nested_loops_equal_eager_bit_for_bit(monkeypatch, spec, native_split):
    """NDQSG's nested worker in C against the eager tiles: codes and reconstructions bit for bit at ordinary, tiny
    and huge scales, for an all-zero gradient (kappa = 0), a length that is not a multiple of 8, shrinkage
    (alpha < 1), odd and even nesting ratios; and the C loops are what ran."""
    calls = _record_calls(monkeypatch, "nested_rows_into", "nested_estimate_into")
    for scale, runs in _nested_round_trips(monkeypatch, spec, ("auto", "0"), 5003, 0.3, seed=4):
        (codes, out), (ref_codes, ref_out) = runs
        assert torch.equal(codes, ref_codes), scale
        assert torch.equal(out.view(torch.int32), ref_out.view(torch.int32)), scale
    assert calls.count("nested_rows_into") == 4 and calls.count("nested_estimate_into") == 4


@needs_c_loops
@pytest.mark.parametrize("k", [2, 4])
def test_c_nested_encode_at_exact_ties_equals_the_plain_arithmetic(k):
    """Inputs built so that t = (g + u) / Delta1 lies exactly on (m + 1/2) k for many elements (Delta1 = 1/4 or 1/2,
    kappa = 1): there round(t) - Q2(t) + h falls below 0 and the small remainder's wrap decides the code. The C
    loop (its 8-wide steps and its scalar tail) against the plain function, element by element."""
    delta1 = 1.0 / k if k == 2 else 0.25
    key = counter_dither.keys(1, 2, "cpu")
    n = 4099
    u = counter_dither.dither_rows(1, n, torch.tensor(0, dtype=torch.int32), key, torch.device("cpu"))[0] * delta1
    m = torch.randint(-3, 4, (n,), generator=torch.Generator().manual_seed(8)).float()
    g = (m + 0.5) * (k * delta1) - u
    ties = (g + u) / delta1 == (m + 0.5) * k  # exact where g + u needs no more bits than float32 holds
    assert ties[:4096].float().mean() > 0.2 and ties[4096:].any()  # in the 8-wide steps and in the scalar tail
    one = torch.ones(1, 1)
    want = torch.empty(1, n, dtype=torch.int8)
    nested.nested_rows_into(want, g.view(1, -1), one, torch.tensor(0, dtype=torch.int32), key, 1.0, delta1, k)
    got = counter_native.nested_rows_into(torch.empty(n, dtype=torch.int8), g, 1.0, key, 1.0, delta1, k)
    assert torch.equal(got, want[0])


@pytest.mark.parametrize("spec", ["qsgd", "dqsg:M=2", "ndqsg", "qcs"])
def test_a_payload_for_another_size_is_refused_before_any_loop_runs(spec):
    """A payload encoded from 100,000 elements and read back as 1,000 (two ranks that disagree on a shape): a clear
    error on every path, never a read or write past a buffer (the C loops trust their lengths)."""
    c, ctx = create(spec), Context(seed=1, worker=1)
    g = torch.randn(100_000, generator=torch.Generator().manual_seed(10))
    wrong = Payload.from_bytes(c.encode(g, ctx).to_bytes(), (1000,), torch.float32)
    side = torch.zeros(1000) if spec == "ndqsg" else None
    with pytest.raises(ValueError, match="payload|elements"):
        c.decode(wrong, ctx, side=side) if side is not None else c.decode(wrong, ctx)


def test_a_key_is_its_two_words_low_first_from_one_fill():
    """keys() fills one int64 whose halves are the key words (little-endian memory, low word first): the words of
    key_words, over seeds whose low words take both signs."""
    for seed in (0, 1, 7, 2**31 - 1, 2**40 + 3, 2**63 - 5):
        for stream in (0, 1, 5):
            want = list(counter_dither.key_words(seed, stream))
            assert counter_dither.keys(seed, stream, "cpu").tolist() == want, (seed, stream)
    # (the seeds are 63-bit: the high word is never negative; the low one takes both signs)
    assert {counter_dither.key_words(s, 0)[0] < 0 for s in range(64)} == {False, True}
