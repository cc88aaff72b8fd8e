"""The queued encode of the threshold sparsifiers (compressors/pending.py, ThresholdSparsifier._enqueue).

On a device the encode is queued without reading anything back, and the payload is read back once when asked for.
Here (no GPU) the queued form runs where the scalars live on the device: on ``meta`` tensors, which hold no values
(any read back raises there, so an enqueue that completes on them reads nothing back), and on CPU tensors under
``GRADSTAT_COMPILE=never``, where its results are compared with the synchronous encode's on the same input.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from _no_host_reads import host_reads, no_copy_to_device, on_meta
from _payloads import assert_same_payload

import gradstat.compressors  # noqa: F401  (registers every compressor)
from gradstat.analysis.bench.timing import host_syncs
from gradstat.compressors import graphs
from gradstat.compressors import pending as pending_module
from gradstat.compressors.base import Compressor
from gradstat.compressors.context import Context
from gradstat.compressors.registry import create
from gradstat.compressors.schemes.sparsifiers import queued as queued_module
from gradstat.compressors.schemes.sparsifiers import sidco as sidco_module
from gradstat.compressors.schemes.sparsifiers import threshold as threshold_module
from gradstat.compressors.schemes.sparsifiers import wangni as wangni_module
from gradstat.compressors.schemes.sparsifiers.threshold import ThresholdSparsifier
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels import bounded, primitives, stage_stats, triton_runtime, triton_select, triton_stats
from gradstat.theory.kernels.policy import forced

QUEUED = [
    "dgc:ratio=0.01",
    "dgc:ratio=0.001,fallback=1.5",
    "gmc_topk:ratio=0.01",
    "sidco:ratio=0.01,dist=exp,stages=1",
    "sidco:ratio=0.001,dist=exp,stages=3",
    "sidco:ratio=0.001,dist=gamma,stages=3",
    "sidco:ratio=0.001,dist=gp,stages=3",
    "sidco:ratio=0.01,dist=exp,stages=2,anchor=min_survivor",
    "sidco:ratio=0.01,dist=gamma,stages=2,quantile=approx",
    "sidco:ratio=0.001",
    "redsync:ratio=0.01",
    "redsync:ratio=0.001,band=1.0,max_iter=5",
    "gaussianksgd:ratio=0.01",
    "gaussianksgd:ratio=0.001,max_iter=2",
]
"""Every rule with a queued form, its laws, stage counts, anchors and quantiles, and the searches (bounds and
iteration counts that stop inside and outside the band)."""

CHECKS_DEFERRED = [
    "qsgd",
    "qsgd:bucket=512",
    "terngrad",
    "dqsg",
    "dqsg:dither=torch",
    "ndqsg",
    "ecq",
    "qcs",
    "signsgd",
    "onebit",
    "randk:ratio=0.01",
    "randk_unbiased:ratio=0.01",
    "topk:ratio=0.01",
]
"""Compressors of a fixed message size whose encode is queued with its finiteness checks deferred."""


def _laplace(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-scale * torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def _ctx(c: Compressor, seed: int = 5) -> Context:
    return Context(seed=seed, state=c.new_state())


@contextlib.contextmanager
def _synchronous(c: Compressor) -> Iterator[None]:
    """The synchronous encode: the rule's queued form taken away."""
    kind = type(c)
    assert isinstance(c, ThresholdSparsifier)
    original = kind._queued
    kind._queued = lambda self, *args: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        kind._queued = original  # type: ignore[method-assign]


THRESHOLD_RTOL = 1e-12
"""Where the synchronous SIDCo reads the signed gradient it runs its last stage on the exceedances of the one before,
gathered (:func:`gradstat.theory.pot.multistage_threshold` with ``narrow``); the queued stages sum over the whole
vector, masked (the gathered count is a host value). The same float64 sums in another order: the thresholds agree to
rounding (a few ulps), and the selections exactly unless an element lies within those ulps of the threshold."""


def _same(a: Payload, b: Payload) -> None:
    assert_same_payload(a, b, THRESHOLD_RTOL)


@pytest.fixture(params=["normalised", "signed"])
def stages_read(request, monkeypatch) -> str:
    """Which vector SIDCo's stages read: the normalised magnitudes (where the stage statistics run eagerly, as here
    under ``never`` and on meta tensors) or the signed gradient itself (where they run fused: compiled on CUDA, the
    C loops on a CPU), chosen here by saying the fused statistics run (their eager reference then computes them)."""
    if request.param == "signed":
        monkeypatch.setattr(stage_stats.tail_moments, "fast_for", lambda *args: True)
    return request.param


@on_meta
@pytest.mark.parametrize("spec", QUEUED)
def test_the_queued_encode_reads_nothing_back(spec, stages_read):
    """On meta tensors every read back raises: the enqueue completes there, copies nothing from the host, and leaves
    the payload pending."""
    c = create(spec)
    g = torch.empty(100_003, device="meta")
    ctx = _ctx(c)
    with no_copy_to_device():
        pending = c.enqueue(g, ctx)
    assert not pending.settled


@pytest.mark.cuda
@pytest.mark.parametrize("spec", QUEUED + CHECKS_DEFERRED + ["threshold:eta=2.0", "wangni:ratio=0.01"])
def test_the_queued_encode_does_not_synchronise_on_cuda(spec):
    """torch's own count of the operations that make the host wait (its CUDA sync debug mode), at 2.6M elements,
    with the encode's kernels launched one by one and as a CUDA graph's replay (where the compressor has one)."""
    c = create(spec)
    g = _laplace(2_600_000, 8).cuda()
    ctx = _ctx(c)
    for mode in graphs.POLICIES:
        with graphs.forced(mode):
            for _ in range(graphs.CAPTURE_AFTER):  # builds what compiles; captures the graph (a synchronising step)
                c.encode(g, ctx)
            assert host_syncs(lambda: c.enqueue(g, ctx).payload(), "cuda") == 1, mode  # the settled one's release
            assert host_syncs(lambda: c.enqueue(g, ctx), "cuda") == 0, mode
            pending = c.enqueue(g, ctx)
            assert host_syncs(pending.payload, "cuda") == 1, mode  # the one read back: the count, the checks


@pytest.mark.parametrize("spec", QUEUED)
@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_the_queued_encode_equals_the_synchronous_one(spec, scale, device, stages_read):
    """Indices, values, bits and every diagnostic bit for bit, over a vector with zeros and ties, at three scales
    (on a CPU under ``never``, where the scalars live in 0-d tensors as on a device)."""
    c = create(spec)
    g = _laplace(50_000, 11, scale).to(device)
    g[::97] = 0.0
    with forced("never" if device.type == "cpu" else "auto"):
        pending = c.enqueue(g, _ctx(c))
        assert not pending.settled  # the queued form ran
        queued = pending.payload()
        with _synchronous(c):
            synchronous = c.encode(g, _ctx(c))
    _same(queued, synchronous)
    assert queued.info["k_hat"] > 0


@pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")
@pytest.mark.parametrize("spec", [f"sidco:ratio={r},dist={d},stages={m}" for r in (0.01, 0.001)
                                  for d, m in (("exp", 1), ("exp", 3), ("gamma", 3), ("gp", 2))])  # fmt: skip
@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_sidcos_selection_skipping_by_its_summarys_peaks_equals_the_synchronous_encode(spec, scale, monkeypatch):
    """The CUDA path, on a CPU by Triton's interpreter: the stage-1 summary stores the sub-block maxima of |g|
    (theory/kernels/peaks.py) and the bounded selection's count and writes skip the sub-blocks below the threshold.
    The payload equals the synchronous encode's, bit for bit but the threshold's last bits (the float64 sums in
    another order)."""
    c = create(spec)
    g = _laplace(50_000, 12, scale)
    g[::89] = 0.0
    g[1000:1400] = 0.0  # (whole sub-blocks of zeros: below every threshold)
    stored: list[object] = []

    def summary_and_peaks(x, *flags):  # type: ignore[no-untyped-def]
        found = triton_stats.summary_and_peaks(x, *flags)
        stored.append(found[1])
        return found

    monkeypatch.setattr(sidco_module, "summary_and_peaks", summary_and_peaks)
    monkeypatch.setattr(bounded, "form_for", lambda x: "triton")
    with forced("never"):
        pending = c.enqueue(g, _ctx(c))
        assert not pending.settled  # the queued form ran
        queued = pending.payload()
        with _synchronous(c):
            synchronous = c.encode(g, _ctx(c))
    assert len(stored) == 1 and stored[0] is not None
    _same(queued, synchronous)
    assert queued.info["k_hat"] > 0


@on_meta
def test_wangnis_queued_encode_reads_nothing_back():
    c = create("wangni:ratio=0.01")
    with no_copy_to_device():
        pending = c.enqueue(torch.empty(100_003, device="meta"), Context(seed=3))
    assert not pending.settled


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_wangnis_queued_encode_equals_the_synchronous_one(scale, monkeypatch):
    """The probabilities and the coins on the device, the kept indices in a buffer: the synchronous payload bit for
    bit (on a CPU under ``never``; the synchronous encode runs on a CPU otherwise), with zeros, for an all-zero
    vector, and through the synchronous encode where the draw outgrows the buffer or the gradient is not finite."""
    c = create("wangni:ratio=0.01")
    g = _laplace(40_000, 12, scale)
    g[::53] = 0.0
    for vector in (g, torch.zeros(3000)):
        want = c.encode(vector, Context(seed=3, step=2))
        with forced("never"):
            pending = c.enqueue(vector, Context(seed=3, step=2))
            assert not pending.settled
            _same(pending.payload(), want)
    assert want.info["k_hat"] == 0
    synchronous = c.encode(g, Context(seed=3, step=2))
    monkeypatch.setattr(wangni_module, "capacity", lambda d, k: k // 2)  # (the draw keeps about k: overflows)
    with forced("never"):
        _same(c.enqueue(g, Context(seed=3, step=2)).payload(), synchronous)
    bad = g.clone()
    bad[7] = math.nan
    with forced("never"):
        pending = c.enqueue(bad, Context(seed=3))
    for _ in range(2):
        with pytest.raises(ValueError, match="NaN|finite"):
            pending.payload()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_wangnis_queued_payload_reads_back_once_in_every_dtype(dtype):
    """The count, the gradient's finiteness and the send's checks of the values (their range in the wire dtype, a
    nonzero value arriving as zero) in one read, where the send's own checks read again (float32: its finiteness;
    the others: the cast to the wire's float32 or 16 bits); the payload the synchronous encode's."""
    c = create("wangni:ratio=0.01")
    g = _laplace(40_000, 13, 1.0).to(dtype)
    want = c.encode(g, Context(seed=3))
    with forced("never"):
        pending = c.enqueue(g, Context(seed=3))
    with host_reads() as reads:
        got = pending.payload()
    assert reads[0] == 1
    _same(got, want)


@pytest.mark.parametrize(
    ("dtype", "value", "match"),
    [
        (torch.float32, 3e38, "divided by its probability exceeds"),  # g_i / p_i = 3e40 (every p_i = k / d = 0.01)
        (torch.bfloat16, 3e38, "exceeds bfloat16.s range"),
        (torch.float64, 3e38, "exceeds float32's range"),  # sent in float32
        (torch.float64, 1e-300, "would be sent as zero"),  # 1e-298 in float32
    ],
)
def test_wangnis_queued_encode_raises_what_the_send_raises(dtype, value, match):
    c = create("wangni:ratio=0.01")
    g = torch.full((40_000,), value, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        c.encode(g, Context(seed=3))
    with forced("never"):
        pending = c.enqueue(g, Context(seed=3))
    for _ in range(2):
        with pytest.raises(ValueError, match=match):
            pending.payload()


SEARCH_VECTORS = {
    "sparse": lambda gen: torch.randn(50_000, generator=gen) * (torch.rand(50_000, generator=gen) < 0.003),
    "two-valued": lambda gen: (
        (1.0 + (torch.rand(50_000, generator=gen) < 0.5)) * torch.randn(50_000, generator=gen).sign()
    ),
    "few-valued": lambda gen: torch.randint(-3, 4, (50_000,), generator=gen).float(),
}
"""Vectors on which the searches take their other branches: fewer nonzeros than the band's low end (the threshold
falls with no lower bound known, then the exact top-k fallback), and a few distinct values (a selection of every
nonzero, or ties at the edge)."""


@pytest.mark.parametrize("vector", sorted(SEARCH_VECTORS))
@pytest.mark.parametrize("spec", ["redsync:ratio=0.01", "redsync:ratio=0.01,band=6", "gaussianksgd:ratio=0.01"])
def test_the_queued_searches_equal_the_synchronous_ones_on_their_other_branches(spec, vector):
    c = create(spec)
    g = SEARCH_VECTORS[vector](torch.Generator().manual_seed(2))
    with forced("never"):
        pending = c.enqueue(g, _ctx(c))
        assert not pending.settled
        queued = pending.payload()
        with _synchronous(c):
            synchronous = c.encode(g, _ctx(c))
    _same(queued, synchronous)


@pytest.mark.parametrize("spec", ["sidco:ratio=0.01,dist=exp,stages=1", "dgc:ratio=0.01", "gmc_topk:ratio=0.01"])
def test_a_selection_beyond_its_buffer_is_made_again(spec, monkeypatch):
    """A count beyond the buffer runs the synchronous encode: the same payload as without the buffer."""
    c = create(spec)
    g = _laplace(20_000, 3)
    calls = []
    original = Compressor._encode_now

    def spy(self, x, payload, ctx):
        calls.append(x.numel())
        return original(self, x, payload, ctx)

    with forced("never"):
        with _synchronous(c):
            synchronous = c.encode(g, _ctx(c))
        monkeypatch.setattr(Compressor, "_encode_now", spy)
        queued = c.encode(g, _ctx(c))
        assert calls == []  # the buffer held the selection
        monkeypatch.setattr(queued_module, "CAPACITY_FACTOR", 0.1)
        overflowed = c.encode(g, _ctx(c))
    assert calls == [g.numel()]
    _same(queued, synchronous)
    _same(overflowed, synchronous)


@pytest.mark.parametrize(
    "spec", ["sidco:ratio=0.01,dist=exp,stages=3", "dgc:ratio=0.01", "redsync", "gaussianksgd", *CHECKS_DEFERRED]
)
def test_a_non_finite_gradient_is_refused_when_read_back(spec):
    """A threshold rule's read back, or a deferred check's, finds NaN and Inf and raises the gradient's error, again on
    every later read (never a payload)."""
    c = create(spec)
    for bad in (math.nan, math.inf):
        g = _laplace(5000, 4)
        g[1234] = bad
        with forced("never"):
            pending = c.enqueue(g, _ctx(c))
            with pytest.raises(ValueError, match="NaN|Inf|finite"):
                pending.payload()
            with pytest.raises(ValueError, match="NaN|Inf|finite"):  # the same error again, not a payload
                pending.payload()


@pytest.mark.parametrize("spec", ["sidco:ratio=0.01,dist=gamma,stages=2", "dgc:ratio=0.01"])
def test_an_all_zero_gradient_sends_nothing(spec):
    c = create(spec)
    with forced("never"):
        payload = c.encode(torch.zeros(4000), _ctx(c))
    assert payload["indices"].numel() == 0
    assert payload.info["k_hat"] == 0


@pytest.mark.parametrize("dist", ["gamma", "gp"])
def test_constant_magnitudes_fall_back_as_the_synchronous_encode_does(dist):
    c = create(f"sidco:ratio=0.01,dist={dist},stages=2")
    g = torch.full((3000,), 0.5)
    g[::2] = -0.5
    with forced("never"):
        queued = c.encode(g, _ctx(c))
        with _synchronous(c):
            synchronous = c.encode(g, _ctx(c))
    _same(queued, synchronous)
    assert "fallback" in queued.info


def test_adaptive_stages_learn_the_same_in_both_forms():
    """The adaptation reads k_hat when the payload is read back: 15 calls (3 periods) choose the same stages."""
    c = create("sidco:ratio=0.001,stages=adaptive,period=5")
    states = {"queued": c.new_state(), "synchronous": c.new_state()}
    chosen: dict[str, list[object]] = {"queued": [], "synchronous": []}
    with forced("never"):
        for step in range(15):
            g = _laplace(30_000, 100 + step) ** 3  # heavier than exponential: the adaptation moves
            chosen["queued"].append(c.encode(g, Context(seed=1, step=step, state=states["queued"])).info["stages"])
            with _synchronous(c):
                payload = c.encode(g, Context(seed=1, step=step, state=states["synchronous"]))
            chosen["synchronous"].append(payload.info["stages"])
    assert chosen["queued"] == chosen["synchronous"]
    assert len(set(chosen["queued"])) > 1  # the adaptation did move (else this test shows nothing)


def test_a_pending_payload_is_finished_once():
    calls = []
    payload = Payload(shape=torch.Size([3]), dtype=torch.float32)

    def finish() -> Payload:
        calls.append(1)
        return payload

    pending = pending_module.Pending(finish)
    assert not pending.settled
    assert pending.payload() is payload and pending.payload() is payload
    assert calls == [1] and pending.settled
    assert pending_module.Pending.ready(payload).settled


def test_encodes_without_a_queued_form_finish_at_once():
    """A fixed threshold is queued only where its exact selection runs by Triton (CUDA: no target to size a buffer
    by, so it counts first), and on a CPU's host scalars no encode is queued: both finish in enqueue here."""
    g = _laplace(1000, 2)
    with forced("never"):
        assert create("threshold:eta=1.0").enqueue(g, Context(seed=1)).settled
    assert create("qsgd").enqueue(g, Context(seed=1)).settled


@pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")
def test_a_fixed_threshold_queued_by_triton_equals_the_synchronous_encode(monkeypatch):
    """Where the exact selection runs by Triton (CUDA; here its interpreted form, by saying it runs) the fixed
    threshold counts in enqueue and selects when read back: the synchronous payload at three scales, with zeros, an
    all-zero vector (nothing sent, threshold +inf) and non-finite values (the gradient's error, on every read)."""
    cases = [(_laplace(30_000, s, scale), 2.0 * scale) for s, scale in ((1, 1.0), (2, 1e-30), (3, 1e30))]
    cases[0][0][::89] = 0.0
    cases.append((torch.zeros(5000), 1.0))
    cases.append((_laplace(3000, 5), 1e39))  # beyond float32: inf, nothing selected (as a host number would give)
    want = [create(f"threshold:eta={eta!r}").encode(g, Context(seed=1)) for g, eta in cases]
    _triton_selects(monkeypatch)
    for (g, eta), synchronous in zip(cases, want, strict=True):
        pending = create(f"threshold:eta={eta!r}").enqueue(g, Context(seed=1))
        assert not pending.settled
        _same(pending.payload(), synchronous)
    assert want[0].info["k_hat"] > 0
    for empty in want[-2:]:
        assert empty.info["k_hat"] == 0 and math.isinf(float(empty.info["threshold"]))
    for bad in (math.nan, -math.inf):
        g = _laplace(3000, 4)
        g[2999] = bad
        pending = create("threshold:eta=1.0").enqueue(g, Context(seed=1))
        for _ in range(2):
            with pytest.raises(ValueError, match="NaN|Inf|finite"):
                pending.payload()


def _triton_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Say the exact selection runs by Triton until it has failed (on CUDA it does; here its interpreted form then
    runs)."""

    def runs(x: torch.Tensor) -> bool:
        return not primitives.EXACT_FALLBACK.is_set()

    monkeypatch.setattr(threshold_module, "triton_exact", runs)
    monkeypatch.setattr(primitives, "triton_exact", runs)


@pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")
@pytest.mark.parametrize("fails", ["count", "write"])
def test_a_failed_triton_selection_makes_the_fixed_threshold_encode_synchronously(fails, monkeypatch):
    """A Triton kernel that fails to build or run, at the count (in enqueue) or at the writes (when read back), is
    reported once and the synchronous encode runs: its payload, never the error."""
    g = _laplace(20_000, 6)
    want = create("threshold:eta=1.5").encode(g, Context(seed=1))
    _triton_selects(monkeypatch)
    monkeypatch.setattr(primitives, "EXACT_FALLBACK", triton_runtime.Fallback("the Triton exact selection", "X"))
    original = triton_select.build

    def build(interpret: bool) -> tuple[object, object]:
        count_kernel, write_kernel = original(interpret)
        return (_Launcher(), write_kernel) if fails == "count" else (count_kernel, _Launcher())

    monkeypatch.setattr(triton_select, "build", build)
    monkeypatch.setattr(_Launcher, "launches", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = create("threshold:eta=1.5").enqueue(g, Context(seed=1)).payload()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "ptxas failed here" in messages[0], messages
    assert _Launcher.launches == 1  # failed once: the synchronous encode that follows does not try it again
    _same(got, want)


class _Launcher:
    """A Triton kernel that fails at its launch (``kernel[grid](*args)`` raises, as a failed build would); counts
    the launches tried."""

    launches = 0

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: object, **kwargs: object) -> None:
            _Launcher.launches += 1
            raise RuntimeError("ptxas failed here")

        return launch


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("spec", ["qsgd", "signsgd", "randk_unbiased:ratio=0.01", "topk:ratio=0.01"])
def test_other_dtypes_are_encoded_at_once_with_their_own_errors(spec, dtype):
    """Only a float32 gradient is queued with its checks deferred: narrowing a 16-bit gradient's scales, or a float64
    one's values, to the wire reads back a range check, which would meet a deferred NaN first. Other dtypes encode
    at once, and NaN raises the gradient's own error there."""
    c = create(spec)
    g = _laplace(3000, 6).to(dtype)
    with forced("never"):
        assert c.enqueue(g, _ctx(c)).settled
        g[5] = math.nan
        with pytest.raises(ValueError, match="gradient holds 1 NaN/Inf"):
            c.enqueue(g, _ctx(c))


@on_meta
@pytest.mark.parametrize("worker", [0, 1, 2])
def test_ndqsgs_nested_group_is_queued_too(worker):
    """NDQSG's workers from p1 up send nested indices (the P2 path): queued on meta tensors, and equal to the
    synchronous payload on a CPU under never."""
    c = create("ndqsg")
    ctx = Context(seed=4, worker=worker)
    with no_copy_to_device():
        assert not c.enqueue(torch.empty(50_001, device="meta"), ctx).settled
    g = _laplace(50_001, 12)
    with forced("never"):
        pending = c.enqueue(g, ctx)
        assert not pending.settled
        _same(pending.payload(), c._encode_now(g, Payload(shape=g.shape, dtype=g.dtype), ctx))


@on_meta
@pytest.mark.parametrize("spec", [s for s in CHECKS_DEFERRED if "dither=torch" not in s])
def test_deferred_checks_read_nothing_back(spec):
    """As above (torch's own generator, ``dither=torch``, has no meta form: its queued encode is checked on CUDA by
    the sync count below)."""
    c = create(spec)
    assert c.defers_checks
    g = torch.empty(100_003, device="meta")
    ctx = _ctx(c)
    with no_copy_to_device():
        pending = c.enqueue(g, ctx)
    assert not pending.settled


@pytest.mark.parametrize("spec", CHECKS_DEFERRED)
def test_deferred_checks_give_the_synchronous_payload(spec, device):
    """The encode with its checks deferred takes the same path as without (every check passes here): a deferral
    that changed what the encode does (a check read back anyway, a branch taken on an assumed answer) fails this."""
    c = create(spec)
    g = _laplace(30_000, 21).to(device)
    with forced("never" if device.type == "cpu" else "auto"):
        pending = c.enqueue(g, _ctx(c))
        assert not pending.settled
        queued = pending.payload()
        synchronous = c._encode_now(g, Payload(shape=g.shape, dtype=g.dtype), _ctx(c))
    _same(queued, synchronous)


@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_the_fixed_threshold_is_queued_into_the_buffer_its_earlier_encodes_sized(scale, device):
    """The first encode of a size runs the exact selection and sizes the buffer (room_for of the count); later ones
    are queued into it and equal the synchronous payload bit for bit; a selection that overflows the buffer is encoded
    exactly (the same payload) and grows it; an all-zero and a non-finite gradient take the synchronous path's answer
    (on a CPU under ``never``)."""
    from gradstat.compressors.schemes.sparsifiers.threshold import room_for

    c = create(f"threshold:eta={2.5 * scale}")
    plain = create(f"threshold:eta={2.5 * scale}")
    g = _laplace(50_000, 13, scale).to(device)
    g[::97] = 0.0
    with forced("never" if device.type == "cpu" else "auto"):
        first = c.enqueue(g, Context())
        first_payload = first.payload()
        k = first_payload.info["k_hat"]
        assert c._rooms == {50_000: room_for(50_000, k)} and k > 0
        for step in range(2):
            pending = c.enqueue(g, Context(step=step))
            assert not pending.settled  # queued into the remembered buffer
            exact = create(f"threshold:eta={2.5 * scale}")  # (a fresh one: its first encode is the exact selection)
            _same(pending.payload(), exact.encode(g, Context(step=step)))
        wide = g * 4.0  # about twice as many above eta: past the buffer
        want = plain.encode(wide, Context())
        assert want.info["k_hat"] > c._rooms[50_000]
        _same(c.encode(wide, Context()), want)
        assert c._rooms[50_000] == room_for(50_000, want.info["k_hat"])
        zeros = torch.zeros_like(g)
        _same(c.encode(zeros, Context()), create(f"threshold:eta={2.5 * scale}").encode(zeros, Context()))
        bad = g.clone()
        bad[7] = math.nan
        with pytest.raises(ValueError, match="NaN"):
            c.encode(bad, Context())


@pytest.mark.parametrize("shared", [False, True])
def test_named_tensors_are_all_queued_before_any_is_read(shared, device, monkeypatch):
    """encode_named queues every layer's encode before reading any back (on a CPU under ``never``, where the queued
    forms run, and on CUDA); two layers given one state are read in turn. The payloads equal encoding each layer on
    its own, in order, with states of their own updated alike."""
    from gradstat.compressors.base import encode_named
    from gradstat.compressors.pending import Pending

    log: list[tuple[str, int]] = []
    enqueue, payload = Compressor.enqueue, Pending.payload

    def logged_enqueue(self, g, ctx=None):
        pending = enqueue(self, g, ctx)
        log.append(("queue", id(pending)))
        return pending

    def logged_payload(self):
        log.append(("read", id(self)))
        return payload(self)

    monkeypatch.setattr(Compressor, "enqueue", logged_enqueue)
    monkeypatch.setattr(Pending, "payload", logged_payload)
    spec = "sidco:ratio=0.01,dist=exp,stages=adaptive"
    c, plain = create(spec), create(spec)
    grads = {f"layer{i}": _laplace(20_000 + 1000 * i, 30 + i).to(device) for i in range(3)}
    one = c.new_state()
    states = {name: one if shared else c.new_state() for name in grads}
    one_plain = plain.new_state()
    plain_states = {name: one_plain if shared else plain.new_state() for name in grads}
    with forced("never" if device.type == "cpu" else "auto"):
        for step in range(6):  # (past the adaptive period: the states change)
            log.clear()
            got = encode_named(c, grads, Context(step=step), states)
            kinds = [kind for kind, _ in log]
            want = {
                name: plain.encode(g, Context(step=step, block=i, state=plain_states[name]))
                for i, (name, g) in enumerate(grads.items())
            }
            for name in grads:
                _same(got[name], want[name])
            assert kinds.count("queue") == 3 and kinds.count("read") == 3
            if shared:  # each layer read before the next is queued
                assert kinds[:5] == ["queue", "read", "queue", "read", "queue"]
            else:  # every layer queued before the first read
                assert kinds[:3] == ["queue"] * 3
