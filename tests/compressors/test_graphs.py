"""Queued encodes replayed as CUDA graphs (compressors/graphs.py).

On a CUDA device the real graphs replay SIDCo's queued encode and are held to the encode without them, bit for bit.
Without one, the bookkeeping (when a key is captured, which launches replay, what a replay's payload may keep of the
graph's outputs, what happens when a capture fails) runs over an emulated graph: its capture runs the device part
once and keeps the outputs; its replay runs it again and writes the results into those same tensors, as a real
graph's replay writes into the memory it captured. A payload that kept a view of the outputs is then overwritten by
the next replay, as it would be on a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Any

import pandas as pd
import pytest
import torch
from _payloads import assert_same_payload
from _recorded_graph import Recorder, replay

import gradstat.compressors  # noqa: F401  (registers every compressor)
from gradstat.compressors import graphs
from gradstat.compressors.base import Compressor
from gradstat.compressors.context import Context
from gradstat.compressors.registry import create
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels import counter_dither, triton_dither, triton_runtime
from gradstat.theory.kernels.counter_dither import KeySlots, slots_for_keys
from gradstat.theory.kernels.policy import forced

SPECS = [
    "sidco:ratio=0.01,dist=exp,stages=1,packed=false",
    "sidco:ratio=0.001,dist=exp,stages=3",
    "sidco:ratio=0.001,dist=gamma,stages=3,packed=false",
    "sidco:ratio=0.001,dist=gp,stages=3",
    "sidco:ratio=0.001",
    "dgc:ratio=0.01,packed=false",
    "dgc:ratio=0.001,fallback=1.5",
    "gmc_topk:ratio=0.01",
    "threshold:eta=1.5,packed=false",
    "threshold:eta=2.5",
]
"""SIDCo's laws and stage counts (fixed and adaptive), the sampled thresholds (their sample drawn from each step's
own seed: keys refilled before each replay) and the fixed threshold (queued once its first encode has sized the
buffer: a graph per buffer size), with plain int32 indices (a payload that kept the graph's own index buffer would
show it) and packed ones."""


def _laplace(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-scale * torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def _write_into(old: Any, new: Any) -> None:
    """Copy ``new``'s tensors into ``old``'s, through tuples, dicts and dataclasses (what a replay does to the
    outputs), but a payload's seed: a host value, which a graph's replay does not write."""
    if isinstance(old, torch.Tensor):
        old.copy_(new)
    elif isinstance(old, dict):
        for key in old:
            if key != "seed":
                _write_into(old[key], new[key])
    elif isinstance(old, tuple):
        for a, b in zip(old, new, strict=True):
            _write_into(a, b)
    elif dataclasses.is_dataclass(old):
        for field in dataclasses.fields(old):
            _write_into(getattr(old, field.name), getattr(new, field.name))


class _Replaying(KeySlots):
    """The keys of a replay: the slots the capture took, in the order it took them (a graph reads the same memory)."""

    def __init__(self, captured: KeySlots) -> None:
        super().__init__(None)
        self.taken = iter(captured.slots)

    def take(self, seed, stream, device):
        return next(self.taken)[0]


class Emulated(graphs.Backend):
    """A graph stand-in on any device (see the module docstring): the capture runs the device part with the key
    slots (unfilled, as in a real capture), each replay runs it again on the same slots, which the cache fills with
    the call's keys before it."""

    def warm_up(self, fn, device):
        fn()

    def capture(self, fn, device, slots):
        with slots_for_keys(slots):
            outputs = fn()
        return (fn, outputs, slots), outputs

    def replay(self, graph):
        fn, outputs, slots = graph
        with slots_for_keys(_Replaying(slots)):
            _write_into(outputs, fn())


class Recorded(graphs.Backend):
    """Graphs emulated by recording the capture's operations and Triton launches (tests/compressors/
    _recorded_graph.py): every host value of the capture baked in, and its allocations poisoned at each replay (the
    pool's reuse), as on a GPU."""

    def warm_up(self, fn, device):
        fn()

    def capture(self, fn, device, slots):
        recorder = Recorder()
        original = triton_dither.run
        triton_dither.run = lambda *args: recorder.launch(original, *args)
        try:
            with slots_for_keys(slots), recorder:
                outputs = fn()
        finally:
            triton_dither.run = original
        return recorder, outputs

    def replay(self, graph):
        replay(graph)


@contextlib.contextmanager
def _nothing():
    yield


class Failing(Emulated):
    def capture(self, fn, device, slots):
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.fixture
def emulated(monkeypatch):
    """Graphs on CPU tensors, over the queued form (which runs on a CPU under ``GRADSTAT_COMPILE=never``)."""
    monkeypatch.setattr(graphs, "replays_on", lambda x: True)
    monkeypatch.setattr(graphs, "_WARNED", set())
    with forced("never"):
        yield


_same = assert_same_payload


def _copy(p: Payload) -> Payload:
    out = Payload(shape=p.shape, dtype=p.dtype)
    for name, part in p.parts.items():
        out.parts[name] = dataclasses.replace(part, tensor=part.tensor.clone())
    out.info.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in p.info.items()})
    return out


def _steps(
    spec: str, device: str, steps: int = 5, backend: graphs.Backend | None = None, size: int = 60_000
) -> tuple[list[Payload], list[Payload], graphs.GraphCache]:
    """Encode ``steps`` different gradients held in one buffer, as a hook does, with graphs and without; the payloads
    with graphs are kept whole until the end (a later replay must not change an earlier payload). On the CPU the
    graphs are ``backend``'s (:class:`Emulated` by default)."""
    c, plain = create(spec), create(spec)
    cache = graphs.cache_of(c, backend or Emulated()) if device == "cpu" else graphs.cache_of(c)
    buffer = torch.empty(size, device=device)
    ctx, plain_ctx = Context(state=c.new_state()), Context(state=plain.new_state())
    kept, copies, wanted = [], [], []
    mode = "all" if spec.startswith("threshold") else "auto"  # (the fixed threshold's graph: under all only)
    for step in range(steps):
        buffer.copy_(_laplace(buffer.numel(), 100 + step))
        with graphs.forced(mode):
            payload = c.encode(buffer, ctx.but(step=step))
        kept.append(payload)
        copies.append(_copy(payload))
        with graphs.forced("never"):
            wanted.append(plain.encode(buffer, plain_ctx.but(step=step)))
    for payload, copy in zip(kept, copies, strict=True):
        _same(payload, copy)  # nothing a payload holds was overwritten by a later replay
    assert cache.redone == 0  # no replay's checks failed (its payload would be the direct encode's, hiding it)
    return kept, wanted, cache


def test_the_fixed_threshold_replays_as_a_graph_under_all_only(emulated):
    """Until a GPU run shows its replays equal, the fixed threshold's queued form is captured under the graph policy
    ``all`` only; under ``auto`` it launches its kernels one by one (queued all the same)."""
    for mode, captured in (("auto", False), ("all", True)):
        c = create("threshold:eta=2.0")
        cache = graphs.cache_of(c, Emulated())
        g = _laplace(30_000, 4)
        with graphs.forced(mode):
            for step in range(4):
                c.encode(g, Context(step=step))
        assert (cache.captures > 0) == captured, mode


def _sizing_steps(spec: str) -> int:
    """Steps of :func:`_steps` that may run without a graph beyond the capture's: the fixed threshold's first
    encode (exact: it sizes the buffer) and one growth of its buffer where a later count passes its rounding (a new
    key, sighted anew)."""
    return 2 if spec.startswith("threshold") else 0


@pytest.mark.parametrize("spec", SPECS)
def test_replayed_encodes_equal_the_direct_ones(spec, emulated):
    """Bit for bit, every step, payloads kept across later replays; the key is captured at its second sighting and
    replayed after (the adaptive SIDCo captures once per stage count it uses)."""
    kept, wanted, cache = _steps(spec, "cpu")
    for got, want in zip(kept, wanted, strict=True):
        _same(got, want)
    assert cache.captures >= 1
    assert cache.replays >= 5 - graphs.CAPTURE_AFTER - (cache.captures - 1) - _sizing_steps(spec)


@pytest.mark.cuda
@pytest.mark.parametrize("spec", SPECS)
def test_cuda_graphs_equal_the_direct_encode(spec):
    """The real graphs: the same check on the GPU, with the compiled kernels where they build (``auto``)."""
    kept, wanted, cache = _steps(spec, "cuda")
    for got, want in zip(kept, wanted, strict=True):
        _same(got, want)
    assert cache.replays >= 1 and cache.captures >= 1


CHECKS_DEFERRED = [
    "qsgd",
    "qsgd:bucket=512",
    "terngrad",
    "dqsg",
    "ndqsg",
    "qcs",
    "signsgd",
    "onebit",
    "topk:ratio=0.01",
    "randk:ratio=0.01",
    "randk_unbiased:ratio=0.01",
]
"""The rules of a fixed message size whose encode is queued with its checks deferred: none declares that it replays
as a graph yet (Compressor.replays_as_graph: the first GPU run found the replays unequal), so the tests below
declare it for every class themselves (``declared``)."""


@pytest.fixture
def declared(monkeypatch):
    """Every compressor class declares that its encode with deferred checks replays as a graph."""
    monkeypatch.setattr(Compressor, "replays_as_graph", True)


@pytest.mark.parametrize("spec", CHECKS_DEFERRED)
def test_no_encode_with_deferred_checks_is_captured_until_its_class_declares_it(spec, emulated):
    c = create(spec)
    cache = graphs.cache_of(c, Emulated())
    g = _laplace(30_000, 8)
    for step in range(3):
        c.encode(g, Context(step=step))
    assert (cache.captures, cache.replays) == (0, 0)


@pytest.mark.parametrize("spec", CHECKS_DEFERRED)
def test_replayed_encodes_with_deferred_checks_equal_the_direct_ones(spec, emulated, declared):
    """Five steps, five seeds, one buffer: every payload (its dither and signs drawn from its own seed's keys, its
    seed part this call's) equals the direct encode, and later replays change none of them."""
    kept, wanted, cache = _steps(spec, "cpu")
    for got, want in zip(kept, wanted, strict=True):
        _same(got, want)
    assert cache.captures == 1 and cache.replays == 5 - graphs.CAPTURE_AFTER + 1


@pytest.mark.cuda
@pytest.mark.parametrize("spec", CHECKS_DEFERRED)
def test_cuda_graphs_with_deferred_checks_equal_the_direct_encode(spec, declared):
    """The real graphs of every rule with deferred checks. On the first H100 run the rules that draw keys failed
    here (their key slots shared memory with the capture's temporaries: see Compressor.replays_as_graph)."""
    kept, wanted, cache = _steps(spec, "cuda")
    for got, want in zip(kept, wanted, strict=True):
        _same(got, want)
    assert cache.replays >= 1 and cache.captures == 1


def test_the_policy_all_replays_the_encodes_no_class_declares(emulated):
    """``GRADSTAT_CUDA_GRAPHS=all``: the encodes with deferred checks are captured and replayed, equal to the direct
    ones, without their class declaring it; ``auto`` leaves them direct."""
    for mode, captures in (("auto", 0), ("all", 1)):
        c, plain = create("dqsg"), create("dqsg")
        cache = graphs.cache_of(c, Emulated())
        g = _laplace(30_000, 9)
        with graphs.forced(mode):
            got = [c.encode(g, Context(step=step)) for step in range(3)]
        with graphs.forced("never"):
            want = [plain.encode(g, Context(step=step)) for step in range(3)]
        for a, b in zip(got, want, strict=True):
            _same(a, b)
        assert (cache.captures, cache.replays) == (captures, 2 * captures), mode


def test_the_microbench_row_of_all_graphs_says_whether_the_replays_equal(emulated):
    """The microbench's ``(all graphs)`` quantizer row on emulated graphs: replayed, and equal; with a replay that
    leaves the capture's outputs as they were (the fault a GPU run must not hide), or one that computes from the
    data the capture saw, not equal (the row compares on other data in the same buffer); with a capture that fails,
    not replayed (no verdict); and no row for an encode no graph replays. The buffer holds its data again after."""
    from gradstat.analysis.bench import microbench
    from gradstat.analysis.bench._microbench_report import _cuda_goals
    from gradstat.analysis.bench.timing import Timing

    class Stale(Emulated):
        def replay(self, graph):
            pass

    class CapturedData(Emulated):
        """A replay that computes from the data the capture saw (what a value baked into a graph would do)."""

        def capture(self, fn, device, slots):
            self.seen = g.clone()
            return super().capture(fn, device, slots)

        def replay(self, graph):
            now = g.clone()
            g.copy_(self.seen)
            try:
                super().replay(graph)
            finally:
                g.copy_(now)

    g, read, cpu = _laplace(30_000, 5), Timing(1.0, 1.0, 1.0), torch.device("cpu")
    rows = []
    cases = ((Emulated(), True, True), (Stale(), True, False), (CapturedData(), True, False), (Failing(), False, None))
    for backend, replayed, equal in cases:
        c = create("dqsg")
        graphs.cache_of(c, backend)
        with pytest.warns(RuntimeWarning, match="could not be captured") if not replayed else _nothing():
            row = microbench._all_graphs_row(c, "dqsg", g, Context(seed=3), 30_000, "1", 2, read, cpu)
        assert row is not None and row["name"] == "dqsg (all graphs)" and row["op"] == "encode"
        assert (row["replayed"], row["replay_equal"]) == (replayed, equal)
        rows.append(row)
    assert torch.equal(g, _laplace(30_000, 5))  # (the row's other data undone)
    plain = create("powersgd")  # (no deferred checks: no graph)
    assert microbench._all_graphs_row(plain, "powersgd", g, Context(seed=3), 30_000, "1", 2, read, cpu) is None
    # the goals table: shown, not judged, with the verdict of each (rows as a CUDA run writes them)
    table = pd.DataFrame(
        [
            {**r, "threads": "cuda", "size": 26_000_000, "group": "quantizer", "ratio": None, "host_syncs": 1}
            for r in rows
        ]
        + [{"threads": "cuda", "size": 26_000_000, "group": "read", "op": "read", "name": "g.sum()", "GB/s": 2000.0}]
    )
    text = "\n".join(_cuda_goals(table))
    assert "host synchronisation" not in text  # (these rows are not judged by it either)
    for verdict in ("its replay equal to the direct encode", "its replay NOT equal", "no graph was replayed"):
        assert verdict in text


@pytest.mark.parametrize(
    "spec", ["randk:ratio=0.01", "randk_unbiased:ratio=0.01", "gmc_topk:ratio=0.05,sample_ratio=0.2"]
)
@pytest.mark.parametrize("backend", [Emulated, Recorded])
def test_the_bounded_subset_replays_equal_the_direct_encode(spec, backend, emulated, declared, monkeypatch):
    """Random-k's form off the CPU (the bounded subset: hash keys, a selection into a buffer, its condition among
    the deferred checks, or for GMC's sample among its threshold's reads), taken here on CPU tensors, with its keys
    by Triton's interpreter: captured, replayed over five steps and seeds, each payload the direct encode's."""
    if backend is Recorded and not triton_runtime.available():
        pytest.skip("needs Triton 3 (its interpreter runs the hash keys on the CPU)")
    from gradstat.compressors.schemes.sparsifiers import randk

    monkeypatch.setattr(randk, "bounded_form", lambda device: True)
    monkeypatch.setattr(counter_dither, "triton_for", lambda name, out, blocks, rows, rest=(): triton_dither.applies(
        name, out, blocks, rows, rest))  # fmt: skip
    kept, wanted, cache = _steps(spec, "cpu", backend=backend(), size=20_000)
    for got, want in zip(kept, wanted, strict=True):
        _same(got, want)
    assert cache.captures == 1 and cache.replays == 5 - graphs.CAPTURE_AFTER + 1


def test_no_graph_for_a_torch_dither_or_a_per_worker_state(emulated, declared):
    for spec in ("dqsg:dither=torch", "qsgd"):
        c = create(spec)
        cache = graphs.cache_of(c, Emulated())
        ctx = Context(state=object()) if spec == "qsgd" else Context()
        g = _laplace(30_000, 7)
        for step in range(3):
            c.encode(g, ctx.but(step=step))
        assert (cache.captures, cache.replays) == (0, 0), spec


RECORDED = [s for s in SPECS if s.startswith(("sidco", "threshold"))] + [
    "dgc:ratio=0.01",
    "qsgd",
    "terngrad",
    "dqsg",
    "ecq",
    "qcs",
    "ndqsg",
]
"""The rules whose device part runs on a CPU as torch operations and Triton launches only (random-k's CPU subset and
signSGD's CPU signs take other paths than on a GPU, and are left out here)."""


@pytest.mark.parametrize("spec", RECORDED)
def test_replays_of_the_recorded_capture_equal_the_direct_encode(spec, emulated, declared, monkeypatch):
    """The stricter stand-in: a replay runs the capture's recorded operations, host values baked in and the
    capture's allocations poisoned as on a GPU, with the quantizers' Triton kernels (interpreted) where a GPU runs
    them; five steps, five seeds, one buffer."""
    if not triton_runtime.available():
        pytest.skip("needs Triton 3 (its interpreter runs the quantize kernels on the CPU)")
    monkeypatch.setattr(counter_dither, "triton_for", lambda name, out, blocks, rows, rest=(): triton_dither.applies(
        name, out, blocks, rows, rest))  # fmt: skip
    kept, wanted, cache = _steps(spec, "cpu", backend=Recorded(), size=6_000)
    for got, want in zip(kept, wanted, strict=True):
        _same(got, want)
    expected = 5 - graphs.CAPTURE_AFTER + 1 - (cache.captures - 1) - _sizing_steps(spec)
    assert cache.captures >= 1 and cache.replays >= expected


@pytest.mark.parametrize("spec", ["redsync", "gaussianksgd", "dgc:ratio=0.01", "sidco"])
@pytest.mark.parametrize("turned", ["nan", "zero"])
def test_a_replay_sees_a_gradient_turn_non_finite_or_zero_after_its_capture(spec, turned, emulated, declared):
    """A replay computes every value it reads (recorded stand-in: the capture's operations run again on the same
    buffer): the largest magnitude of the gradient in the buffer now, not one the warm-up computed and a finiteness
    check kept for the next caller (memory outside the graph's pool, freed after the capture on a GPU). A NaN that
    arrives after the capture raises the direct encode's error; an all-zero gradient sends nothing."""
    c, plain = create(spec), create(spec)
    cache = graphs.cache_of(c, Recorded())
    buffer = torch.empty(6_000)
    with graphs.forced("all"):
        for step in range(3):
            buffer.copy_(_laplace(buffer.numel(), 100 + step))
            c.encode(buffer, Context(step=step))
        assert cache.replays >= 1
        if turned == "nan":
            buffer[17] = math.nan
            with pytest.raises(ValueError, match="NaN/Inf"):
                c.encode(buffer, Context(step=3))
        else:
            buffer.zero_()
            got = c.encode(buffer, Context(step=3))
            with graphs.forced("never"):
                want = plain.encode(buffer, Context(step=3))
            assert got.info["k_hat"] == 0 and want.info["k_hat"] == 0
    assert cache.replays >= 2  # (step 3 replayed, and its checks sent it to the direct encode)


def test_a_graph_made_payload_keeps_the_shape_and_the_worker_of_the_call(emulated, declared):
    """An encode with deferred checks makes its payload inside the graph: a graph captured for a (200, 300) view of a
    buffer is not replayed for its flat view (the payload says 60,000), and NDQSG's graph for worker 0 (DQSG's
    message) is not replayed for worker 1 (the nested one): each call's payload is the direct encode's."""
    qsgd, plain = create("qsgd"), create("qsgd")
    graphs.cache_of(qsgd, Emulated())
    g = _laplace(60_000, 9)
    for step in range(3):
        qsgd.encode(g.view(200, 300), Context(step=step))
    got = qsgd.encode(g, Context(step=3))
    with graphs.forced("never"):
        _same(got, plain.encode(g, Context(step=3)))
    assert got.shape == (60_000,)
    ndqsg, plain = create("ndqsg"), create("ndqsg")
    graphs.cache_of(ndqsg, Emulated())
    for step in range(3):
        ndqsg.encode(g, Context(step=step, worker=0))
    got = ndqsg.encode(g, Context(step=3, worker=1))
    with graphs.forced("never"):
        want = plain.encode(g, Context(step=3, worker=1))
    assert "nested" in got.parts
    _same(got, want)


def test_a_key_is_captured_at_its_second_sighting_and_a_busy_graph_is_not_replayed(emulated):
    c = create("sidco:ratio=0.01,dist=exp,stages=1,packed=false")
    cache = graphs.cache_of(c, Emulated())
    g = _laplace(30_000, 3)
    first = c.enqueue(g)
    assert (cache.captures, cache.replays) == (0, 0)  # the first sighting launches directly
    second = c.enqueue(g)  # captured and replayed: its outputs are held until its payload is read
    assert (cache.captures, cache.replays) == (1, 1)
    third = c.enqueue(g)  # the graph is busy: a direct launch
    assert cache.replays == 1
    payloads = [p.payload() for p in (first, second, third)]
    c.enqueue(g).payload()  # released: replayed again
    assert cache.replays == 2
    for p in payloads[1:]:
        _same(p, payloads[0])


@pytest.mark.parametrize("spec", ["sidco:ratio=0.01,dist=exp,stages=1,packed=false", "qsgd"])
def test_a_bucket_of_buffers_queued_before_any_is_read(spec, emulated, declared):
    """As the DDP hook sends a bucket: every layer's encode queued, then every payload read, step after step; each
    payload equals the direct encode of its layer and step."""
    c, plain = create(spec), create(spec)
    cache = graphs.cache_of(c, Emulated())
    layers = [torch.empty(n) for n in (20_000, 30_000, 20_000)]
    for step in range(4):
        for i, layer in enumerate(layers):
            layer.copy_(_laplace(layer.numel(), 10 * step + i))
        contexts = [Context(step=step, block=i) for i in range(len(layers))]
        pending = [c.enqueue(layer, ctx) for layer, ctx in zip(layers, contexts, strict=True)]
        got = [p.payload() for p in pending]
        with graphs.forced("never"):
            want = [plain.encode(layer, ctx) for layer, ctx in zip(layers, contexts, strict=True)]
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    assert cache.captures == 3 and cache.replays == 3 * (4 - graphs.CAPTURE_AFTER + 1)


def test_an_encode_that_raises_is_never_captured_and_does_not_turn_graphs_off(emulated):
    """A user's error (a ratio too small for the vector) is raised as it is, every time; it is no capture failure:
    the same compressor still captures a valid buffer."""
    c = create("sidco:ratio=0.01,dist=exp,stages=1")
    cache = graphs.cache_of(c, Emulated())
    tiny = _laplace(50, 1)
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (no warning of a failed capture)
            with pytest.raises(ValueError, match="ratio"):
                c.encode(tiny)
    g = _laplace(30_000, 2)
    for _ in range(3):
        c.encode(g)
    assert (cache.captures, cache.replays) == (1, 2)


def test_only_the_replay_that_holds_a_graph_frees_it(emulated):
    """A replay's release is its own: called late (a finished encode collected after a later replay), it does not
    free the later replay's outputs, which a third launch would otherwise overwrite unread."""
    cache = graphs.GraphCache(Emulated())
    x = torch.arange(4.0)

    def fn():
        return x * 2

    device = torch.device("cpu")
    direct = cache.launch("k", device, fn, "T")
    first = cache.launch("k", device, fn, "T")
    assert not direct.replayed and first.replayed
    first.release()
    second = cache.launch("k", device, fn, "T")
    assert second.replayed
    first.release()  # late, a second time
    third = cache.launch("k", device, fn, "T")
    assert not third.replayed  # the graph is still held by the second
    second.release()
    assert cache.launch("k", device, fn, "T").replayed


def test_a_pending_encode_dropped_unread_frees_its_graph(emulated):
    c = create("sidco:ratio=0.01,dist=exp,stages=1")
    cache = graphs.cache_of(c, Emulated())
    g = _laplace(30_000, 3)
    c.encode(g)
    c.enqueue(g)  # captured, replayed, never read
    c.encode(g)
    assert cache.replays == 2


def test_different_buffers_and_settings_are_different_graphs(emulated):
    c = create("sidco:ratio=0.01,dist=exp,stages=1")
    cache = graphs.cache_of(c, Emulated())
    a, b = _laplace(30_000, 3), _laplace(30_000, 4)
    for _ in range(3):
        c.encode(a)
        c.encode(b)
    assert (cache.captures, cache.replays) == (2, 4)  # each captured at its second sighting, replayed from then on
    c.ratio = 0.02  # another setting: a new key (seen once: direct)
    c.encode(a)
    assert (cache.captures, cache.replays) == (2, 4)


def test_a_failed_capture_is_reported_once_and_the_encode_launches_directly(emulated):
    c = create("sidco:ratio=0.01,dist=exp,stages=1")
    cache = graphs.cache_of(c, Failing())
    g = _laplace(30_000, 5)
    want = c.encode(g)
    with pytest.warns(RuntimeWarning, match="could not be captured as a CUDA graph.*RuntimeError"):
        got = c.encode(g)
    _same(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(c.encode(g), want)  # (tried again, failed again: refused, without a second warning)
        _same(c.encode(g), want)
    assert (cache.captures, cache.replays) == (0, 0) and len(cache.refused) == 1


def test_a_capture_that_failed_once_is_tried_again_at_the_next_sighting(emulated):
    """A first build of a kernel inside a capture fails it (CUDA refuses loading a kernel while a stream is
    captured); the direct launch that follows builds it, so the key's next sighting captures; two failures and the
    key launches directly for good."""

    class FailsOnce(Emulated):
        tries = 0

        def capture(self, fn, device, slots):
            FailsOnce.tries += 1
            if FailsOnce.tries == 1:
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().capture(fn, device, slots)

    c = create("sidco:ratio=0.01,dist=exp,stages=1")
    cache = graphs.cache_of(c, FailsOnce())
    g = _laplace(30_000, 5)
    want = c.encode(g)  # (first sighting: direct)
    with pytest.warns(RuntimeWarning, match="after 2 failed captures"):
        _same(c.encode(g), want)  # (second: its capture fails, the encode launches directly)
    _same(c.encode(g), want)  # (tried again: captured)
    _same(c.encode(g), want)  # (replayed)
    assert (FailsOnce.tries, cache.captures, cache.replays) == (2, 1, 2) and not cache.refused and not cache.failures


def test_no_graph_without_a_key_or_under_never(emulated):
    redsync = create("redsync:ratio=0.01")  # no key declared
    sidco = create("sidco:ratio=0.01")
    caches = [graphs.cache_of(c, Emulated()) for c in (redsync, sidco)]
    g = _laplace(30_000, 6)
    for step in range(3):
        redsync.encode(g, Context(step=step))
        with graphs.forced("never"):
            sidco.encode(g)
    assert all((cache.captures, cache.replays) == (0, 0) for cache in caches)


def test_the_least_recently_used_graph_is_dropped_beyond_the_limit(emulated, monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    c = create("sidco:ratio=0.01,dist=exp,stages=1")
    cache = graphs.cache_of(c, Emulated())
    vectors = [_laplace(30_000, 10 + i) for i in range(3)]
    for v in vectors + vectors:
        c.encode(v)
    assert len(cache.entries) == 2 and cache.captures == 3


def test_a_capture_that_draws_a_key_it_cannot_refill_is_refused(emulated):
    """Keys are refilled from the call seed into slots made before the capture: a key of any other seed, on another
    device, or beyond the slots cannot be, and the capture refuses it (the encode then launches directly, reported
    once)."""
    cpu = torch.device("cpu")
    slots = KeySlots(7, cpu, capacity=2)
    with slots_for_keys(slots):
        first = counter_dither.keys(7, 1, cpu)
        assert first.shape == (2,) and first.data_ptr() == slots.buffer.data_ptr()
        with pytest.raises(ValueError, match="not the call seed"):
            slots.take(8, 1, cpu)
        with pytest.raises(ValueError, match="not on the captured device"):
            slots.take(7, 1, torch.device("meta"))
        assert counter_dither.keys(7, 2, cpu).data_ptr() == slots.buffer[1].data_ptr()
        with pytest.raises(ValueError, match="more than 2 keys"):
            slots.take(7, 3, cpu)
    slots.fill(9)
    want = [counter_dither.keys(9, stream, cpu) for stream in (1, 2)]
    assert torch.equal(slots.buffer[:, :2], torch.stack(want))
    with pytest.raises(ValueError, match="not the call seed"):
        KeySlots(None).take(7, 1, cpu)


def test_every_key_slot_starts_on_a_16_byte_boundary_as_a_fresh_key_does():
    """Triton builds a kernel variant per pointer alignment (16 bytes or not): a slot aligned otherwise than the
    warm-up's freshly allocated key would build and load a new variant inside the capture, which CUDA refuses
    while a stream is captured (QCS draws two keys: its second slot was 8 bytes off). A slot is two contiguous
    int32 words."""
    cpu = torch.device("cpu")
    slots = KeySlots(7, cpu, capacity=counter_dither.KEY_SLOTS)
    with slots_for_keys(slots):
        drawn = [counter_dither.keys(7, stream, cpu) for stream in range(counter_dither.KEY_SLOTS)]
    assert counter_dither.keys(7, 0, cpu).data_ptr() % 16 == 0  # (a fresh key: the warm-up's)
    for slot in drawn:
        assert slot.data_ptr() % 16 == 0 and slot.shape == (2,) and slot.is_contiguous(), slot.data_ptr()


def test_key_slots_made_under_inference_mode_are_refilled_outside_it():
    """A graph captured under torch.inference_mode is replayed outside it too: its key slots take the host's refill
    in place in either mode (an inference tensor would refuse it outside)."""
    cpu = torch.device("cpu")
    with torch.inference_mode():
        slots = KeySlots(7, cpu, capacity=1)
        with slots_for_keys(slots):
            counter_dither.keys(7, 1, cpu)
    slots.fill(9)
    with torch.inference_mode():
        slots.fill(10)
    assert torch.equal(slots.buffer[0, :2], counter_dither.keys(10, 1, cpu))


def test_the_policy_reads_the_environment(monkeypatch):
    for value, want in [("", "auto"), ("never", "never"), ("0", "never"), ("on", "auto"), ("ALL", "all")]:
        monkeypatch.setenv(graphs.ENV, value)
        assert graphs.policy() == want
    monkeypatch.setenv(graphs.ENV, "sometimes")
    with pytest.raises(ValueError, match="GRADSTAT_CUDA_GRAPHS must be one of auto, never, all"):
        graphs.policy()
