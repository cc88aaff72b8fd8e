"""DDP communication hooks: any registered compressor, with error feedback, as a ``register_comm_hook`` hook.

Usage (torch's ``ddp_comm_hooks`` style: a small function plus an explicit state object)::

    state, hook = make_hook("topk:ratio=0.01", "ef", model=ddp.module)
    ddp.register_comm_hook(state, hook)

One call of :func:`compression_hook` per bucket and step, on every rank:

1. split the bucket into blocks (the whole bucket, or each parameter's slice with ``granularity="layer"`` or a
   compressor whose method is per parameter, :attr:`Compressor.per_parameter`: PowerSGD's matrices) and show the
   local gradient to the observers (the per-rank recorder); a block the compressor does not compress (fewer
   elements than ``dense_below`` or than it can compress, or a shape it leaves alone:
   :meth:`Compressor.compresses`) is sent dense at the gradient's width;
2. per block, the first half of the send step (:mod:`gradstat.compressors.memory.send`): ``z = g + compensation
   * h`` (error feedback, over DGC's velocity when set), the encode of z queued with
   ``ctx = (seed, step, worker = rank, block)`` (:meth:`Compressor.enqueue`: on a device a threshold sparsifier reads
   nothing back there), and once every block is queued, each payload read back (:mod:`gradstat.compressors.pending`)
   and serialised to bytes (:meth:`Payload.to_bytes`);
3. exchange: the concatenated bytes of all blocks go through one padded all-gather after a length exchange
   (:mod:`gradstat.compressors.ddp.exchange`); a rank that fails sends its error and every rank raises it;
4. in the future's ``then()`` callback (which never waits): every rank parses every rank's payloads, decodes them
   -- side-information schemes (NDQSG) in the order of Algorithm 2 of Abdi & Fekri (Nested Dithered Quantization):
   the first group (ranks ``0 .. p1 - 1``) without side information, then every later rank in rank order with the
   running average of all messages decoded so far as side information (:meth:`Compressor.decode_all`) -- and writes
   the average into the bucket; each rank lands the second half of its send step (memories updated with what the
   others decoded of its own message).

With ``exchange="allreduce"`` each rank instead decodes its own message and the dense decoded tensors are summed
by one all-reduce (no saving on the wire; useful to separate compression error from transport). With
``compressor=None`` the hook is plain all-reduce, instrumented like the others (the baseline).

Checkpoints: ``state.state_dict()`` / ``load_state_dict()``. A resumed run's first step, on DDP's initial buckets,
is compressed over the buckets the checkpoint was saved with (:mod:`gradstat.compressors.ddp.resume`), so a resumed
run computes what an uninterrupted one does, with any number of buckets.

Per step, ``state.metrics`` (:class:`StepMetrics`) accumulates exact bits, serialised bytes, bytes handed to the
collectives and time spent in the hook; the training loop reads them with ``state.take_metrics()``.
"""

import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from gradstat.compressors.base import Compressor
from gradstat.compressors.context import Context
from gradstat.compressors.ddp.exchange import RemoteError, allreduce_sum, encode_error, gather_messages
from gradstat.compressors.ddp.resume import regrouped, regroups
from gradstat.compressors.ddp.state import (
    Block,
    BucketState,
    BucketView,
    CompressionHookState,
    Exchange,
    Granularity,
    HookSettings,
    HookTaps,
)
from gradstat.compressors.memory.feedback import ErrorFeedback
from gradstat.compressors.memory.send import Memory, WorkerState, send_locally
from gradstat.compressors.registry import create
from gradstat.compressors.wire.payload import Payload

Hook = Callable[[CompressionHookState, dist.GradBucket], torch.futures.Future]
LAYER_KEY = 1 << 20
"""Layer-wise seed key of parameter j of bucket i when no model is bound: ``i * LAYER_KEY + j``."""


def make_hook(
    compressor: str | Compressor | None,
    feedback: str | ErrorFeedback | Memory = "none",
    *,
    model: nn.Module | None = None,
    process_group: dist.ProcessGroup | None = None,
    seed: int = 0,
    granularity: Granularity = "bucket",
    exchange: Exchange = "gather",
    dense_below: int = 0,
    keep_payloads: bool = False,
) -> tuple[CompressionHookState, Hook]:
    """The state and hook for ``compressor`` (a spec string, a compressor, or None for plain all-reduce) with
    ``feedback`` (a memory spec for :func:`gradstat.compressors.memory.send.parse_memory`: ``none``, ``ef``,
    ``qcs:beta=B``, ``ecq:alpha=A,beta=B``, or ``dgc:momentum=0.9`` for DGC's local momentum correction with plain
    error feedback -- use it with an optimizer without momentum; or an :class:`ErrorFeedback` or a :class:`Memory`).
    ``model``: the module DDP wraps (``ddp.module``); binding it makes bucket signatures and layer-wise seeds
    independent of the process. ``dense_below``: blocks of fewer elements are sent dense, as are blocks the
    compressor cannot compress (a sparsifier's ``ratio`` keeping < 1 element; :attr:`HookSettings.dense_below`)."""
    comp = create(compressor) if isinstance(compressor, str) else compressor
    settings = HookSettings(comp, Memory.of(feedback), process_group, seed, granularity, exchange, dense_below)
    state = CompressionHookState(settings, HookTaps(keep_payloads=keep_payloads))
    if model is not None:
        state.bind(model)
    return state, compression_hook


def compression_hook(state: CompressionHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress, exchange and average one DDP bucket (see the module docstring); returns the future of the
    averaged bucket."""
    start = time.perf_counter()
    settings, memory = state.settings, state.memory
    group = settings.process_group
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buffer = bucket.buffer()
    params = bucket.parameters()
    shapes = [tuple(p.shape) for p in params]
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel())
    if offsets[-1] != buffer.numel():
        raise RuntimeError(f"bucket {bucket.index()}: parameters hold {offsets[-1]} elements, buffer {buffer.numel()}")
    positions = memory.positions(params)
    comp = settings.codec
    layerwise = settings.granularity == "layer" or (comp is not None and comp.per_parameter)
    blocks = _blocks(layerwise, bucket.index(), positions, offsets)
    if comp is not None and not layerwise and regroups(state, positions):
        assert positions is not None
        return regrouped(state, positions, buffer, offsets, bucket.is_last(), rank, start, send_blocks)
    signature = tuple(positions) if positions is not None else (bucket.index(), tuple(shapes))
    step = memory.step
    bstate = memory.bucket_state(signature, shapes, len(blocks), step, layerwise)
    bstate.index = bucket.index()
    if bucket.is_last():
        memory.end_step(step)
        memory.step += 1
    if state.taps.observers:
        view = _view(rank, positions, buffer, shapes, offsets, blocks, bstate)
        for observe in state.taps.observers:
            observe(step, view)
    state.metrics.buckets += 1
    if comp is None:
        return _plain_allreduce(state, buffer, world, start)
    block_shapes: list[tuple[int, ...]] = shapes if layerwise else [(buffer.numel(),)]
    grads = [buffer[b.start : b.end].view(shape) for b, shape in zip(blocks, block_shapes, strict=True)]
    state.metrics.dense_blocks += sum(comp.sends_dense(shape) for shape in block_shapes)
    ctxs = [
        Context(seed=settings.seed, step=step, worker=rank, block=b.block, state=w.compressor)
        for b, w in zip(blocks, bstate.blocks, strict=True)
    ]
    if settings.exchange == "allreduce":
        return _decoded_allreduce(state, buffer, blocks, grads, bstate, ctxs, world, start)

    def write(b: int, mean: torch.Tensor) -> None:
        buffer[blocks[b].start : blocks[b].end].copy_(mean.reshape(-1))

    keys = [b.block for b in blocks]
    try:
        return send_blocks(state, grads, bstate.blocks, ctxs, keys, write, buffer, start)
    except RemoteError as exc:
        return _failed(exc)


def send_blocks(
    state: CompressionHookState,
    grads: list[torch.Tensor],
    workers: list[WorkerState],
    ctxs: list[Context],
    keys: list[int],
    write: Callable[[int, torch.Tensor], None],
    result: torch.Tensor,
    start: float,
) -> torch.futures.Future[torch.Tensor]:
    """Steps 2-4 of the module docstring for the blocks ``grads`` (with their worker states and contexts; ``keys``
    name them in metrics and taps): encode, serialise, exchange (waited for: the lengths), and in the future's
    callback decode every rank's payloads, land this rank's send step and ``write(b, mean)`` each block's average
    (flat); the future's value is ``result``. Raises :class:`RemoteError` on every rank when any rank failed."""
    settings = state.settings
    comp = settings.codec
    assert comp is not None
    group = settings.process_group
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    block_shapes = [tuple(g.shape) for g in grads]
    device = result.device
    try:
        flight = settings.memory.begin(grads, workers)
        # every block queued before any is read back: the device works on one while the host queues the next
        pending = [comp.enqueue(z, ctx) for z, ctx in zip(flight.compensated, ctxs, strict=True)]
        payloads = [p.payload() for p in pending]
        message, failed = torch.cat([p.to_bytes(device) for p in payloads]), False
        state.metrics.bits += sum(p.bits for p in payloads)
        state.metrics.wire_bytes += message.numel()
        state.metrics.blocks.update({k: (p.bits, p.wire_bytes) for k, p in zip(keys, payloads, strict=True)})
    except Exception as exc:  # tell every rank, then every rank raises (never a hang)
        message, failed = encode_error(exc, device), True
    gathered = gather_messages(message, failed, group)
    state.metrics.sent_bytes += gathered.sent_bytes
    state.metrics.hook_seconds += time.perf_counter() - start

    def combine(fut: torch.futures.Future) -> torch.Tensor:
        t0 = time.perf_counter()
        fut.value()  # re-raises a failed collective
        per_rank = [split_payloads(gathered.message(r), block_shapes, grads[0].dtype) for r in range(world)]
        decoded = [
            comp.decode_all([per_rank[r][b] for r in range(world)], ctxs[b].but(state=None)) for b in range(len(keys))
        ]
        flight.land([d[rank] for d in decoded])  # before the buffer is overwritten: z may be a view of it
        for b, key in enumerate(keys):
            write(b, torch.stack([d.float() for d in decoded[b]]).mean(0))
            if state.taps.keep_payloads:
                for r in range(world):
                    state.taps.last[(r, key)] = (per_rank[r][b], decoded[b][r].detach().clone())
        state.metrics.hook_seconds += time.perf_counter() - t0
        return result

    return gathered.future.then(combine)


def split_payloads(data: torch.Tensor, shapes: list[tuple[int, ...]], dtype: torch.dtype) -> list[Payload]:
    """The payloads of consecutive blocks (of ``shapes``) serialised back to back in ``data``."""
    out, offset = [], 0
    for shape in shapes:
        p = Payload.from_bytes(data[offset:], shape, dtype)
        offset += p.wire_bytes
        out.append(p)
    if offset != data.numel():
        raise ValueError(f"received {data.numel()} bytes, the payloads hold {offset}")
    return out


# -- helpers --------------------------------------------------------------------------------------------------------
def _failed(exc: Exception) -> torch.futures.Future:
    """A future that holds ``exc``: DDP raises it when it waits for the bucket at the end of the backward pass.

    Raising in the hook's body instead would stop DDP's reducer halfway through marking the bucket's parameters
    ready, and its next backward pass would fail on an internal assert; through the future, every bucket is handed
    over, the backward pass raises ``exc`` on every rank, and the next batch trains normally (the failed bucket's
    memories are left as they were)."""
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(torch.empty(0))

    def fail(_: torch.futures.Future) -> torch.Tensor:
        raise exc  # an error of the callback: torch keeps its type and message (set_exception would not reach DDP)

    return done.then(fail)


def _blocks(layerwise: bool, index: int, positions: list[int] | None, offsets: list[int]) -> list[Block]:
    if not layerwise:
        return [Block(index, 0, offsets[-1])]
    keys = positions if positions is not None else [index * LAYER_KEY + j for j in range(len(offsets) - 1)]
    return [Block(k, offsets[j], offsets[j + 1]) for j, k in enumerate(keys)]


def _view(
    rank: int,
    positions: list[int] | None,
    buffer: torch.Tensor,
    shapes: list[tuple[int, ...]],
    offsets: list[int],
    blocks: list[Block],
    bstate: BucketState,
) -> BucketView:
    """Per-parameter views of the local gradient and of the residual before this step."""
    grads = [buffer[offsets[j] : offsets[j + 1]].view(s) for j, s in enumerate(shapes)]
    return BucketView(rank, positions, grads, [bstate.residual_of(j) for j in range(len(shapes))])


def _plain_allreduce(
    state: CompressionHookState, buffer: torch.Tensor, world: int, start: float
) -> torch.futures.Future:
    nbytes = buffer.numel() * buffer.element_size()
    state.metrics.bits += 8 * nbytes
    state.metrics.wire_bytes += nbytes
    state.metrics.sent_bytes += nbytes
    fut = allreduce_sum(buffer, state.settings.process_group)
    state.metrics.hook_seconds += time.perf_counter() - start

    def average(f: torch.futures.Future) -> torch.Tensor:
        out = f.value()[0].div_(world)
        if not bool(torch.isfinite(out).all()):
            raise ValueError("the all-reduced gradient holds NaN/Inf values (some rank's gradient is not finite)")
        return out

    return fut.then(average)


def _decoded_allreduce(
    state: CompressionHookState,
    buffer: torch.Tensor,
    blocks: list[Block],
    grads: list[torch.Tensor],
    bstate: BucketState,
    ctxs: list[Context],
    world: int,
    start: float,
) -> torch.futures.Future:
    """Each rank encodes and decodes its own blocks; the dense decoded bucket is all-reduced. A rank whose
    compressor refuses its input raises after telling the others through the length exchange."""
    comp, group = state.settings.codec, state.settings.process_group
    assert comp is not None
    out = torch.empty_like(buffer)
    try:
        sent = send_locally(comp, state.settings.memory, grads, bstate.blocks, ctxs)
        for blk, p, z_hat in zip(blocks, sent.payloads, sent.decoded, strict=True):
            out[blk.start : blk.end] = z_hat.reshape(-1)
            state.metrics.bits += p.bits
            state.metrics.wire_bytes += p.wire_bytes
            state.metrics.blocks[blk.block] = (p.bits, p.wire_bytes)
        failed, message = False, out.new_zeros(0, dtype=torch.uint8)
    except Exception as exc:  # tell every rank, then every rank raises (never a hang)
        failed, message = True, encode_error(exc, buffer.device)
    try:
        status = gather_messages(message, failed, group)  # every rank raises if any rank failed
    except RemoteError as exc:
        return _failed(exc)
    status.future.wait()  # an empty message: completes at once; waited in the hook body, not in a callback
    nbytes = out.numel() * out.element_size()
    state.metrics.sent_bytes += nbytes + status.sent_bytes
    fut = allreduce_sum(out, group)
    state.metrics.hook_seconds += time.perf_counter() - start

    def average(f: torch.futures.Future) -> torch.Tensor:
        return buffer.copy_(f.value()[0].div_(world))

    return fut.then(average)
