"""Queued encodes replayed as CUDA graphs: one launch in place of an encode's dozens where the input repeats.

A queued encode (:mod:`gradstat.compressors.pending`) on a GPU launches some 8 to 55 kernels (counted at 2.6M
elements on fake CUDA tensors; 20 to 70 in the code an H100 timed, reports/gpu/2026-11-26T1850Z.md); at 26M elements
on that H100 their device time was a third of the wall time, the rest the host queuing them (Python, dispatch, the
launches). A training loop's hook encodes the same buffers, of the same shape, step after step, which is what a
CUDA graph is for: captured once, the whole device part of the encode is replayed with one launch.

:func:`launch` runs a compressor's device part ``fn`` (a function of nothing but device tensors and host values
fixed by its ``key``) either directly or as the replay of a graph captured from it:

- the ``key`` names everything the device work depends on besides the contents of the input: the compressor's
  hyper-parameters, the host values its queued form reads (e.g. SIDCo's stage count), the input's address, shape,
  strides, dtype and device, and the compile policy. A compressor without a replayable form gives no key and always
  launches directly;
- a key is captured the :data:`CAPTURE_AFTER`-th time it is seen (a one-off encode, e.g. a dump's replay of fresh
  tensors, never pays for a capture), after one warm-up on a side stream as torch requires; at most
  :data:`MAX_GRAPHS` graphs are kept per compressor, the least recently used dropped first;
- each graph owns its memory pool (graphs sharing one could overwrite each other's outputs while both are pending,
  as when a bucket's layers are all queued before any is read);
- a graph's outputs are overwritten by its next replay, so a replayed encode holds its graph until its payload has
  copied what it keeps (:class:`Launched` ``release``); a second encode of the same key queued before then launches
  directly;
- the counter hash's keys an encode draws from its call seed (``Context.call_seed``: a randomized rule's draws) are
  not captured as values: each is a slot, allocated before the capture (not from the graph's pool, whose blocks the
  capture's temporaries share), that is filled with the keys of the call's own seed before its replay
  (:class:`~gradstat.theory.kernels.counter_dither.KeySlots`), so the seed is no part of the key;
- a capture that fails (e.g. a device part that reads a value back after all, draws a key of another seed, or
  records nothing) is reported once per compressor class with its reason and tried once more at the key's next
  sighting; after :data:`CAPTURE_TRIES` failures that input launches directly from then on: the result never
  depends on it.

The policy is the environment variable ``GRADSTAT_CUDA_GRAPHS`` (``auto``, the default: graphs on CUDA; ``all``: also
the encodes whose replays no GPU run has checked yet; ``never``: no graph anywhere), or :func:`forced` for the code it
encloses (the benchmarks time them side by side).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import os
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from gradstat.theory.kernels.counter_dither import KeySlots, slots_for_keys
from gradstat.theory.kernels.policy import overriding
from gradstat.theory.kernels.policy import policy as compile_policy
from gradstat.theory.kernels.primitives import forget_extremes

ENV = "GRADSTAT_CUDA_GRAPHS"
POLICIES = ("auto", "never", "all")
CAPTURE_AFTER = 2
"""The sighting of a key at which it is captured: the first encode of an input launches directly."""
CAPTURE_TRIES = 2
"""Failed captures of a key before it launches directly for good: the second try, at its next sighting, meets the
kernels the first attempt's direct launch built and loaded (CUDA refuses a kernel loaded during a capture)."""
MAX_GRAPHS = 256
"""Graphs kept per compressor (one per input buffer and stage count: a layer-wise hook's tensors); beyond it the
least recently replayed is dropped with its memory."""
MAX_SIGHTINGS = 4096
"""Keys counted per compressor before the count starts over (a stream of fresh inputs never captures)."""

T = TypeVar("T")
_FORCED: contextvars.ContextVar[str | None] = contextvars.ContextVar("gradstat_graphs_forced", default=None)


def policy() -> str:
    """``auto`` (graphs on CUDA, for the compressors whose replays a GPU run has shown equal to the direct encode),
    ``all`` (also for the encodes with deferred checks that no GPU run has shown so yet: the quantizers', random-k's;
    see :attr:`Compressor.replays_as_graph <gradstat.compressors.base.Compressor.replays_as_graph>`) or ``never``,
    from ``GRADSTAT_CUDA_GRAPHS`` or :func:`forced`; a clear error for another value (``0``/``off``/``false``/``no``
    mean ``never``, ``1``/``on``/``true``/``yes`` mean ``auto``)."""
    override = _FORCED.get()
    if override is not None:
        return override
    raw = (os.environ.get(ENV) or "auto").strip().lower() or "auto"
    value = {"0": "never", "off": "never", "false": "never", "no": "never"}.get(raw, raw)
    value = {"1": "auto", "on": "auto", "true": "auto", "yes": "auto"}.get(value, value)
    if value not in POLICIES:
        raise ValueError(f"{ENV} must be one of {', '.join(POLICIES)} (or 0/1), got {raw!r}")
    return value


@contextlib.contextmanager
def forced(mode: str) -> Iterator[None]:
    """Run the enclosed code under graph policy ``mode`` (``auto``, ``all`` or ``never``) in this thread (context)
    only."""
    with overriding(_FORCED, mode, POLICIES, "graph policy"):
        yield


def hyper_key(owner: object) -> tuple[Hashable, ...] | None:
    """The part of a key that names a compressor's settings: its class and its hyper-parameters' values (None where
    one of them cannot be hashed: no graph then)."""
    values = (type(owner), *(getattr(owner, f.name) for f in dataclasses.fields(owner)))  # type: ignore[arg-type]
    try:
        hash(values)
    except TypeError:
        return None
    return values


def input_key(x: torch.Tensor) -> tuple[Hashable, ...]:
    """The part of a key that names an input buffer: its address, shape, strides, dtype, device and the compile
    policy (which forms of the kernels the device part launches)."""
    return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device, compile_policy())


@dataclass
class Launched(Generic[T]):
    """A device part launched: its ``outputs`` (the graph's own tensors where ``replayed``) and ``release``, to be
    called once the caller has copied what it keeps from them (a no-op for a direct launch)."""

    outputs: T
    replayed: bool
    release: Callable[[], None]
    redone: Callable[[], None] = dataclasses.field(default=lambda: None)
    """To be called where the caller discards a replay's outputs and encodes again synchronously (a check the
    replay left on the device failed): counted in the cache's :attr:`GraphCache.redone`."""

    def freed_with(self, finish: Callable[[], Any]) -> Callable[[], Any]:
        """``finish`` (the function that reads the outputs), after which the graph is freed also when ``finish`` is
        dropped unread (collected): a pending encode that nobody reads does not hold its graph for ever."""
        if self.replayed:
            weakref.finalize(finish, self.release)
        return finish


def _nothing() -> None:
    return None


class Backend:
    """How graphs are captured and replayed: CUDA's (here), or a stand-in for tests of the bookkeeping."""

    def warm_up(self, fn: Callable[[], Any], device: torch.device) -> None:
        """Run ``fn`` once on a side stream of ``device`` (what torch asks before a capture); its errors are the
        encode's own, raised as they are."""
        with torch.cuda.device(device):
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                fn()
            current.wait_stream(side)

    def capture(self, fn: Callable[[], Any], device: torch.device, slots: KeySlots) -> tuple[Any, Any]:
        """Capture ``fn`` into a graph with a pool of its own (the keys it draws taken from ``slots``) on a stream
        of ``device``, the current device made ``device`` (so that its kernels, launched on the current device's
        stream, are the ones captured), and return ``(graph, outputs)``; the graph has not run yet. A capture that
        records nothing (torch only warns) raises: its replays would silently leave the outputs as they were."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stream = torch.cuda.Stream(device)
            with torch.cuda.graph(graph, stream=stream, **_capture_options()), slots_for_keys(slots):
                outputs = fn()
        empty = [w for w in caught if "graph is empty" in str(w.message).lower()]
        if empty:
            raise RuntimeError(f"the captured graph is empty ({str(empty[0].message).splitlines()[0]})")
        for w in caught:  # (the others are the encode's own: passed on)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return graph, outputs

    def replay(self, graph: Any) -> None:
        graph.replay()


def _capture_options() -> dict[str, Any]:
    """Capture errors only for this thread's own calls (a collective's watchdog thread may query events meanwhile),
    where this torch has the option."""
    if "capture_error_mode" in inspect.signature(torch.cuda.graph.__init__).parameters:
        return {"capture_error_mode": "thread_local"}
    return {}


class _Entry:
    __slots__ = ("graph", "outputs", "slots", "holder")

    def __init__(self, graph: Any, outputs: Any, slots: KeySlots) -> None:
        self.graph, self.outputs, self.slots = graph, outputs, slots
        self.holder: object | None = None
        """The replay whose outputs still wait to be read (None: free); only that replay's release frees it."""


class GraphCache:
    """One compressor's graphs (:data:`MAX_GRAPHS` at most) and its count of keys seen."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.seen: dict[Hashable, int] = {}
        self.refused: set[Hashable] = set()
        """Keys whose capture failed :data:`CAPTURE_TRIES` times: they launch directly from then on."""
        self.failures: dict[Hashable, int] = {}
        """Keys whose capture failed fewer times than that, and how often."""
        self.captures = 0
        self.replays = 0
        self.redone = 0
        """Replays whose outputs their caller discarded for a synchronous encode: a deferred check that failed, or
        a threshold rule's selection past its buffer or of an all-zero gradient. On inputs that pass every check
        and fit their buffers, none; a replay that computes other values than the direct launch can show here
        rather than in a payload."""

    def launch(
        self, key: Hashable, device: torch.device, fn: Callable[[], T], who: str, call_seed: int | None = None
    ) -> Launched[T]:
        entry = self.entries.get(key)
        if entry is None:
            if key in self.refused:
                return Launched(fn(), False, _nothing)
            sightings = self.seen.get(key, 0) + 1
            if len(self.seen) >= MAX_SIGHTINGS and key not in self.seen:
                self.seen.clear()
                self.failures.clear()
            if sightings < CAPTURE_AFTER:
                outputs = fn()  # (an encode that raises is never counted, so never captured)
                self.seen[key] = sightings
                return Launched(outputs, False, _nothing)
            # (the capture computes all it reads: no value an earlier call kept for the next, such as the extremes
            # a finiteness check shares with max_abs, whose memory lies outside the graph's pool and is freed)
            forget_extremes()
            self.backend.warm_up(fn, device)  # (its errors are the encode's own)
            slots = KeySlots(call_seed, device)  # (before the capture: not from its pool; None: keys refused)
            forget_extremes()
            try:
                graph, outputs = self.backend.capture(fn, device, slots)
            except Exception as exc:  # noqa: BLE001  (any failure to capture leaves the direct launch, reported)
                failures = self.failures.pop(key, 0) + 1
                if failures >= CAPTURE_TRIES:
                    self.refused.add(key)
                else:  # tried again at the key's next sighting (a first build inside the capture is done by then)
                    self.failures[key] = failures
                    self.seen[key] = CAPTURE_AFTER - 1
                if who not in _WARNED:
                    _WARNED.add(who)
                    warnings.warn(
                        f"gradstat: {who}'s queued encode could not be captured as a CUDA graph "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); this input's "
                        f"encode launches its kernels one by one after {CAPTURE_TRIES} failed captures (same "
                        "results, more host time per call)",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                return Launched(fn(), False, _nothing)
            finally:
                forget_extremes()  # (nor does a later call take values that live in the graph's pool)
            entry = self.entries[key] = _Entry(graph, outputs, slots)
            self.seen.pop(key, None)
            self.failures.pop(key, None)
            self.captures += 1
            while len(self.entries) > MAX_GRAPHS:
                self.entries.popitem(last=False)
        elif entry.holder is not None:  # its outputs still wait to be read: this one launches on its own
            return Launched(fn(), False, _nothing)
        self.entries.move_to_end(key)
        if entry.slots.slots:
            assert call_seed is not None  # (a capture that drew keys had a call seed: the key holds its compressor)
            entry.slots.fill(call_seed)
        self.backend.replay(entry.graph)
        self.replays += 1
        holder = entry.holder = object()

        def release() -> None:  # (this replay's only: a late second call cannot free a later replay's outputs)
            if entry.holder is holder:
                entry.holder = None

        def redone() -> None:
            self.redone += 1

        return Launched(entry.outputs, True, release, redone)


_WARNED: set[str] = set()
"""Compressor classes whose failed capture was reported in this process (one warning each)."""
_CACHES: dict[int, GraphCache] = {}


def cache_of(owner: object, backend: Backend | None = None) -> GraphCache:
    """``owner``'s graph cache (made on first use, dropped with ``owner``)."""
    found = _CACHES.get(id(owner))
    if found is None:
        found = _CACHES[id(owner)] = GraphCache(backend or Backend())
        weakref.finalize(owner, _CACHES.pop, id(owner), None)
    return found


def replays_on(x: torch.Tensor) -> bool:
    """Whether an encode of ``x`` may replay a graph: ``x`` on a CUDA device, and no capture of the caller's own
    under way (a graph is not captured inside another)."""
    return x.device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


def launch(
    owner: object, key: Hashable | None, x: torch.Tensor, fn: Callable[[], T], call_seed: int | None = None
) -> Launched[T]:
    """Run ``fn`` (the device part of ``owner``'s encode of ``x``) directly, or as a CUDA graph's replay where
    ``key`` is given, ``x`` is on a CUDA device and the policy allows (see the module docstring). ``call_seed``:
    the seed of this call (``Context.call_seed``), from which the keys ``fn`` draws are refilled before each replay
    (:class:`~gradstat.theory.kernels.counter_dither.KeySlots`); None where ``fn`` draws none."""
    if key is None or policy() == "never" or not replays_on(x):
        return Launched(fn(), False, _nothing)
    return cache_of(owner).launch((key, input_key(x)), x.device, fn, type(owner).__name__, call_seed)
