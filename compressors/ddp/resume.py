"""A resumed run's first step, compressed over the buckets the checkpoint was saved with.

DDP builds its buckets anew in every process: its first iteration runs its initial buckets (parameters in reverse
order, a small first bucket) and only then rebuilds them in the order gradients became ready. A checkpoint saved
after the rebuild holds the hook's memories per rebuilt bucket; a resumed run's first step hands the hook the
initial buckets, which may hold other sets of parameters. Compressed bucket by bucket as handed, that step would
differ from an uninterrupted run's (other blocks, fresh compressor states). Instead, with ``granularity="bucket"``
and the gather exchange, :func:`regrouped` compresses that step over the saved buckets:

- every parameter of a DDP bucket is filed under the saved bucket that holds it (a view of its slice);
- a saved bucket whose parameters have all arrived is compressed as one block -- its parameters' gradients in its
  saved order, with its saved memories, compressor state and seed key (its DDP index) -- and exchanged (every rank
  launches the same blocks in the same order: the DDP buckets arrive in the same order everywhere);
- a DDP bucket's future completes once every saved bucket it holds a part of has been averaged and written back
  (DDP waits for the futures only after the last bucket's hook ran, so a future may complete from a later bucket's
  exchange).

The next step runs DDP's rebuilt buckets, the saved ones again, so the resumed run computes what the uninterrupted
run did, bit for bit. A failure (a rank's NaN, a refused input, a parameter no saved bucket holds) fails every DDP
bucket of the step on every rank, as the hook's other failures do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from gradstat.compressors.context import Context
from gradstat.compressors.ddp.exchange import RemoteError
from gradstat.compressors.ddp.state import BucketState, BucketView, CompressionHookState, WorkerState

Send = Callable[..., torch.futures.Future]


@dataclass
class Regroup:
    """One step's regrouping: ``group_of`` files each parameter position under its saved bucket's key; ``pieces``
    holds the arrived slices per saved bucket; ``waiting`` the DDP buckets' futures with their buffers and the saved
    buckets they hold parts of; ``launched`` and ``done`` the saved buckets sent and written back; ``stopped``: a
    failure every rank met in its hook body (no more saved buckets are sent, on any rank); ``failure``: the error
    the step's buckets end with (also one met in a callback, which ranks may meet at different times, so it does
    not stop the sending)."""

    step: int
    group_of: dict[int, tuple]
    pieces: dict[tuple, dict[int, torch.Tensor]] = field(default_factory=dict)
    waiting: list[tuple[torch.futures.Future, torch.Tensor, set[tuple]]] = field(default_factory=list)
    launched: set[tuple] = field(default_factory=set)
    done: set[tuple] = field(default_factory=set)
    stopped: bool = False
    failure: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def settle(self) -> None:
        """Complete the futures of the DDP buckets whose saved buckets are all written back (or fail them all after
        a failure); from the hook and from the exchanges' callbacks alike."""
        with self.lock:
            for ready, buffer, keys in self.waiting:
                if ready.done():
                    continue
                if self.failure is not None:
                    ready.set_exception(self.failure)
                elif keys <= self.done:
                    ready.set_result(buffer)

    def fail(self, exc: BaseException, stop: bool = False) -> None:
        """End every DDP bucket of the step with ``exc`` (the first failure wins); ``stop``: met by every rank in
        its hook body, so no rank sends another saved bucket."""
        self.stopped = self.stopped or stop
        if self.failure is None:
            self.failure = exc
        self.settle()


def regroups(state: CompressionHookState, positions: list[int] | None) -> bool:
    """Whether this DDP bucket (``positions``) is compressed over the saved buckets (see the module docstring):
    the first step after a resume, bucket-wise with the gather exchange, a bucket other than a saved one (or one
    of a step already regrouping), every parameter held by a saved bucket that knows its DDP index."""
    memory, settings = state.memory, state.settings
    if memory.regroup is not None:
        return True
    if memory.resumed is None or positions is None or settings.exchange != "gather" or settings.granularity != "bucket":
        return False
    if tuple(sorted(positions)) in memory.resumed:
        return False
    saved = [memory.buckets[k] for k in memory.resumed]
    held = {pos for b in saved for pos in b.signature}
    return all(b.index is not None for b in saved) and set(positions) <= held


def regrouped(
    state: CompressionHookState,
    positions: list[int],
    buffer: torch.Tensor,
    offsets: list[int],
    last: bool,
    rank: int,
    start: float,
    send: Send,
) -> torch.futures.Future[torch.Tensor]:
    """File this DDP bucket's parameters under the saved buckets, send every saved bucket now complete, and return
    a future completed when this bucket's parts are averaged (see the module docstring)."""
    memory = state.memory
    if memory.regroup is None:
        group_of = {pos: key for key in sorted(memory.resumed or ()) for pos in memory.buckets[key].signature}
        memory.regroup = Regroup(memory.step, group_of)
    plan: Regroup = memory.regroup
    step = plan.step
    touched: list[tuple] = []
    grads = [buffer[offsets[j] : offsets[j + 1]] for j in range(len(positions))]
    for pos, piece in zip(positions, grads, strict=True):
        key = plan.group_of.get(pos)
        if key is None:  # regroups() admits none on a step's first bucket; a later bucket could hold one
            plan.fail(RuntimeError(f"parameter {pos} is in no bucket of the resumed hook state"), stop=True)
            break
        plan.pieces.setdefault(key, {})[pos] = piece
        if key not in touched:
            touched.append(key)
    ready: torch.futures.Future = torch.futures.Future()
    plan.waiting.append((ready, buffer, set(touched)))
    state.metrics.buckets += 1
    if state.taps.observers:
        _observe(state, step, rank, positions, grads, plan)
    for key in sorted(plan.pieces) if last else touched:  # the last bucket sends every saved bucket left
        if not plan.stopped and key not in plan.launched:
            complete = len(plan.pieces[key]) == len(memory.buckets[key].signature)
            if complete or last:
                _launch(state, plan, key, complete, rank, start, send)
    if last:
        memory.end_step(step)
        memory.step += 1
        memory.regroup = None
    plan.settle()
    return ready.then(lambda f: f.value())  # an error reaches DDP from a callback (see hook._failed)


def _launch(
    state: CompressionHookState, plan: Regroup, key: tuple, complete: bool, rank: int, start: float, send: Send
) -> None:
    """Send saved bucket ``key`` as one block; write its average back into the DDP buckets' slices."""
    memory, settings = state.memory, state.settings
    plan.launched.add(key)
    saved: BucketState = memory.buckets[key]
    if not complete:
        missing = sorted(set(saved.signature) - set(plan.pieces[key]))
        plan.fail(RuntimeError(f"DDP handed no gradient of parameters {missing} (saved bucket {list(key)})"), True)
        return
    bstate = memory.bucket_state(saved.signature, saved.shapes, 1, plan.step, False)
    pieces = [plan.pieces[key][pos] for pos in bstate.signature]
    flat = torch.cat(pieces)
    assert settings.codec is not None and bstate.index is not None
    state.metrics.dense_blocks += int(settings.codec.sends_dense(tuple(flat.shape)))
    worker: WorkerState = bstate.blocks[0]
    ctx = Context(seed=settings.seed, step=plan.step, worker=rank, block=bstate.index, state=worker.compressor)

    def write(_: int, mean: torch.Tensor) -> None:
        at = 0
        for piece in pieces:
            piece.copy_(mean[at : at + piece.numel()])
            at += piece.numel()
        plan.done.add(key)

    def settle(fut: torch.futures.Future) -> None:
        try:
            fut.value()
        except Exception as exc:  # a decode failure: every waiting bucket must hear of it, or DDP waits forever
            plan.fail(exc)
            return
        plan.settle()

    try:
        send(state, [flat], [worker], [ctx], [bstate.index], write, flat, start).then(settle)
    except RemoteError as exc:  # raised on every rank, in the hook body
        plan.fail(exc, stop=True)


def _observe(
    state: CompressionHookState, step: int, rank: int, positions: list[int], grads: list[torch.Tensor], plan: Regroup
) -> None:
    """Show this DDP bucket's local gradients, and each parameter's residual from its saved bucket, to the
    observers."""
    memory = state.memory
    shaped, residuals = [], []
    for pos, g in zip(positions, grads, strict=True):
        saved = memory.buckets[plan.group_of[pos]]
        j = saved.signature.index(pos)
        shaped.append(g.view(saved.shapes[j]))
        residuals.append(saved.residual_of(j))
    view = BucketView(rank, positions, shaped, residuals)
    for observe in state.taps.observers:
        observe(step, view)
