"""DDP communication hooks: any registered compressor, with error feedback, as a ``register_comm_hook`` hook.

Usage (torch's ``ddp_comm_hooks`` style: a small function plus an explicit state object)::

    state, hook = make_hook("topk:ratio=0.01", "ef", model=ddp.module)
    ddp.register_comm_hook(state, hook)

One call of :func:`compression_hook` per bucket and step, on every rank:

1. split the bucket into blocks (the whole bucket, or each parameter's slice with ``granularity="layer"``) and
   show the local gradient to the observers (the per-rank recorder);
2. per block: ``z = g + compensation * h`` (error feedback), ``payload = C.encode(z, ctx)`` with
   ``ctx = (seed, step, worker = rank, block)``, serialised to bytes (:meth:`Payload.to_bytes`);
3. exchange: the concatenated bytes of all blocks go through one padded all-gather after a length exchange
   (:mod:`gradstat.compressors.ddp.exchange`); a rank that fails sends its error and every rank raises it;
4. in the future's ``then()`` callback (which never waits): every rank parses every rank's payloads, decodes them
   -- side-information schemes (NDQSG) in the order of Algorithm 2 of Abdi & Fekri (Nested Dithered Quantization):
   the first group (ranks ``0 .. p1 - 1``) without side information, then every later rank in rank order with the
   running average of all messages decoded so far as side information -- and writes the average into the bucket;
   each rank updates its residual with what the others decoded of its own message.

With ``exchange="allreduce"`` each rank instead decodes its own message and the dense decoded tensors are summed
by one all-reduce (no saving on the wire; useful to separate compression error from transport). With
``compressor=None`` the hook is plain all-reduce, instrumented like the others (the baseline).

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
from gradstat.compressors.ddp.exchange import allreduce_sum, encode_error, gather_messages
from gradstat.compressors.ddp.state import (
    Block,
    BucketState,
    BucketView,
    CompressionHookState,
    Exchange,
    Granularity,
)
from gradstat.compressors.memory.feedback import ErrorFeedback, parse_feedback
from gradstat.compressors.memory.momentum import LocalMomentumState
from gradstat.compressors.registry import create
from gradstat.compressors.wire.payload import Payload

Hook = Callable[[CompressionHookState, dist.GradBucket], torch.futures.Future]
LAYER_KEY = 1 << 20
"""Layer-wise seed key of parameter j of bucket i when no model is bound: ``i * LAYER_KEY + j``."""


def make_hook(
    compressor: str | Compressor | None,
    feedback: str | ErrorFeedback = "none",
    *,
    model: nn.Module | None = None,
    process_group: dist.ProcessGroup | None = None,
    seed: int = 0,
    granularity: Granularity = "bucket",
    exchange: Exchange = "gather",
    keep_payloads: bool = False,
) -> tuple[CompressionHookState, Hook]:
    """The state and hook for ``compressor`` (a spec string, a compressor, or None for plain all-reduce) with
    ``feedback`` (a spec for :func:`parse_feedback`, an :class:`ErrorFeedback`, or ``dgc:momentum=0.9`` for DGC's
    local momentum correction with plain error feedback; use it with an optimizer without momentum). ``model``:
    the module DDP wraps (``ddp.module``); binding it makes bucket signatures and layer-wise seeds independent of
    the process."""
    comp = create(compressor) if isinstance(compressor, str) else compressor
    momentum, masking = None, True
    if isinstance(feedback, str) and feedback.strip().partition(":")[0] == "dgc":
        momentum, masking = parse_local_momentum(feedback)
        feedback = "ef"
    fb = parse_feedback(feedback) if isinstance(feedback, str) else feedback
    if comp is None and (fb.compensation != 0.0 or fb.decay != 0.0):
        raise ValueError("error feedback needs a compressor (plain all-reduce has no compression error)")
    state = CompressionHookState(
        comp, fb, process_group, seed, granularity, exchange, keep_payloads, momentum=momentum, masking=masking
    )
    if model is not None:
        state.bind(model)
    return state, compression_hook


def parse_local_momentum(spec: str) -> tuple[float, bool]:
    """``dgc`` | ``dgc:momentum=0.9,masking=true``: DGC's local momentum correction (with plain error feedback)."""
    _, _, rest = spec.strip().partition(":")
    momentum, masking = 0.9, True
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, _, value = item.partition("=")
        if key == "momentum":
            try:
                momentum = float(value)
            except ValueError:
                raise ValueError(f"feedback spec {spec!r}: momentum {value!r} is not a number") from None
        elif key == "masking" and value.lower() in ("true", "1", "false", "0"):
            masking = value.lower() in ("true", "1")
        else:
            raise ValueError(f"feedback spec {spec!r}: {item!r}; dgc takes momentum=<[0, 1)> and masking=true|false")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"DGC momentum must lie in [0, 1), got {momentum}")
    return momentum, masking


def compression_hook(state: CompressionHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress, exchange and average one DDP bucket (see the module docstring); returns the future of the
    averaged bucket."""
    start = time.perf_counter()
    group = state.process_group
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buffer = bucket.buffer()
    params = bucket.parameters()
    shapes = [tuple(p.shape) for p in params]
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel())
    if offsets[-1] != buffer.numel():
        raise RuntimeError(f"bucket {bucket.index()}: parameters hold {offsets[-1]} elements, buffer {buffer.numel()}")
    positions = state.positions(params)
    blocks = _blocks(state.granularity, bucket.index(), positions, offsets)
    signature = tuple(positions) if positions is not None else (bucket.index(), tuple(shapes))
    step = state.step
    bstate = state.bucket_state(signature, shapes, len(blocks), step, state.granularity == "layer")
    if bucket.is_last():
        state.end_step(step)
        state.step += 1
    if state.observers:
        view = _view(rank, positions, buffer, shapes, offsets, blocks, bstate)
        for observe in state.observers:
            observe(step, view)
    state.metrics.buckets += 1
    if state.compressor is None:
        return _plain_allreduce(state, buffer, world, start)
    block_shapes: list[tuple[int, ...]] = shapes if state.granularity == "layer" else [(buffer.numel(),)]
    ctxs = [
        Context(seed=state.seed, step=step, worker=rank, block=b.block, state=w.compressor)
        for b, w in zip(blocks, bstate.blocks, strict=True)
    ]
    if state.exchange == "allreduce":
        return _decoded_allreduce(state, buffer, blocks, block_shapes, bstate, ctxs, world, start)
    comp, fb = state.compressor, state.feedback
    zs: list[torch.Tensor] = []
    try:
        payloads = []
        for blk, shape, w, ctx in zip(blocks, block_shapes, bstate.blocks, ctxs, strict=True):
            z = fb.compensate(_local_momentum(state, w, buffer[blk.start : blk.end].view(shape)), w.feedback)
            zs.append(z)
            payloads.append(comp.encode(z, ctx))
        message, failed = torch.cat([p.to_bytes(buffer.device) for p in payloads]), False
        state.metrics.bits += sum(p.bits for p in payloads)
        state.metrics.wire_bytes += message.numel()
        state.metrics.blocks.update({b.block: (p.bits, p.wire_bytes) for b, p in zip(blocks, payloads, strict=True)})
    except Exception as exc:  # tell every rank, then every rank raises (never a hang)
        message, failed = encode_error(exc, buffer.device), True
    gathered = gather_messages(message, failed, group)
    state.metrics.sent_bytes += gathered.sent_bytes
    state.metrics.hook_seconds += time.perf_counter() - start

    def combine(fut: torch.futures.Future) -> torch.Tensor:
        t0 = time.perf_counter()
        fut.value()  # re-raises a failed collective
        per_rank = [split_payloads(gathered.message(r), block_shapes, buffer.dtype) for r in range(world)]
        for b, (blk, w) in enumerate(zip(blocks, bstate.blocks, strict=True)):
            ctx = ctxs[b].but(state=None)
            decoded = decode_all(comp, [per_rank[r][b] for r in range(world)], ctx)
            fb.update(zs[b], decoded[rank], w.feedback)
            _mask_momentum(state, w, decoded[rank])
            mean = torch.stack([d.float() for d in decoded]).mean(0)
            buffer[blk.start : blk.end].copy_(mean.reshape(-1))
            if state.keep_payloads:
                for r in range(world):
                    state.last[(r, blk.block)] = (per_rank[r][b], decoded[r].detach().clone())
        state.metrics.hook_seconds += time.perf_counter() - t0
        return buffer

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


def decode_all(comp: Compressor, payloads: list[Payload], ctx: Context) -> list[torch.Tensor]:
    """Every rank's reconstruction of one block, in rank order. Side-information schemes follow Algorithm 2 of
    Abdi & Fekri (Nested Dithered Quantization): the first group (ranks below ``comp.p1``) is decoded without side
    information and averaged; each later rank is decoded with the running average of all messages decoded so far,
    which is then updated with it (the order of :meth:`gradstat.compressors.schemes.quantizers.ndqsg.NDQSG.round`)."""
    if not comp.properties.needs_side:
        return [comp.decode(p, ctx.but(worker=r)) for r, p in enumerate(payloads)]
    first = min(int(getattr(comp, "p1", 1)), len(payloads))
    decoded = [comp.decode(payloads[r], ctx.but(worker=r)) for r in range(first)]
    side = torch.stack([d.float() for d in decoded]).mean(0)
    for r in range(first, len(payloads)):
        out = comp.decode(payloads[r], ctx.but(worker=r), side=side)
        decoded.append(out)
        side = side + (out.float() - side) / len(decoded)
    return decoded


# -- helpers --------------------------------------------------------------------------------------------------------
def _local_momentum(state: CompressionHookState, w: LocalMomentumState, g: torch.Tensor) -> torch.Tensor:
    """DGC's velocity ``u <- momentum * u + g`` (what feedback then accumulates), or ``g`` when off."""
    if state.momentum is None:
        return g
    w.velocity = g.float() if w.velocity is None else state.momentum * w.velocity + g.float()
    return w.velocity


def _mask_momentum(state: CompressionHookState, w: LocalMomentumState, sent: torch.Tensor) -> None:
    """DGC's momentum factor masking: zero the velocity where this rank's message was nonzero."""
    if state.momentum is not None and state.masking and w.velocity is not None:
        w.velocity = w.velocity.masked_fill(sent.reshape(w.velocity.shape) != 0, 0.0)


def _blocks(granularity: Granularity, index: int, positions: list[int] | None, offsets: list[int]) -> list[Block]:
    if granularity == "bucket":
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
    fut = allreduce_sum(buffer, state.process_group)
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
    shapes: list[tuple[int, ...]],
    bstate: BucketState,
    ctxs: list[Context],
    world: int,
    start: float,
) -> torch.futures.Future:
    """Each rank encodes and decodes its own blocks; the dense decoded bucket is all-reduced. A rank whose
    compressor refuses its input raises after telling the others through the length exchange."""
    comp, fb = state.compressor, state.feedback
    assert comp is not None
    out = torch.empty_like(buffer)
    try:
        for blk, shape, w, ctx in zip(blocks, shapes, bstate.blocks, ctxs, strict=True):
            z = fb.compensate(_local_momentum(state, w, buffer[blk.start : blk.end].view(shape)), w.feedback)
            p = comp.encode(z, ctx)
            z_hat = comp.decode(p, ctx)
            fb.update(z, z_hat, w.feedback)
            _mask_momentum(state, w, z_hat)
            out[blk.start : blk.end] = z_hat.reshape(-1)
            state.metrics.bits += p.bits
            state.metrics.wire_bytes += p.wire_bytes
            state.metrics.blocks[blk.block] = (p.bits, p.wire_bytes)
        failed, message = False, out.new_zeros(0, dtype=torch.uint8)
    except Exception as exc:  # tell every rank, then every rank raises (never a hang)
        failed, message = True, encode_error(exc, buffer.device)
    status = gather_messages(message, failed, state.process_group)  # every rank raises if any rank failed
    status.future.wait()  # an empty message: completes at once; waited in the hook body, not in a callback
    nbytes = out.numel() * out.element_size()
    state.metrics.sent_bytes += nbytes + status.sent_bytes
    fut = allreduce_sum(out, state.process_group)
    state.metrics.hook_seconds += time.perf_counter() - start

    def average(f: torch.futures.Future) -> torch.Tensor:
        return buffer.copy_(f.value()[0].div_(world))

    return fut.then(average)
