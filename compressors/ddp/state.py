"""The explicit, checkpointable state of a compression hook: per rank, per DDP bucket, per block.

One :class:`CompressionHookState` lives on each rank (like torch's ``PowerSGDState``), in four parts: ``settings``
(:class:`HookSettings`: what to run, fixed for the run), ``memory`` (:class:`BucketMemories`: the step counter and
the per-bucket memories, what a checkpoint holds), ``metrics`` (:class:`StepMetrics`, this step's totals) and
``taps`` (:class:`HookTaps`: observers and the optional capture of what was received). For every DDP bucket the
memories hold a :class:`BucketState`: the bucket's signature (which parameters it holds, in which order) and, per
block (the whole bucket, or each parameter's slice in layer-wise mode), a
:class:`~gradstat.compressors.memory.send.WorkerState`: the error-feedback residual, DGC's velocity and the
compressor's state (SIDCo's stage count, PowerSGD's warm-start factor). States are keyed by the bucket's signature
(the positions of its parameters among the model's trainable parameters, in bucket order), not by DDP's bucket
index.

DDP rebuilds its buckets after the first iteration of every DDP instance (and a bucket index may then hold other
parameters). A bucket with a new signature is counted in ``rebuilds``; its error-feedback residual (and DGC's
velocity) is carried over exactly: a per-coordinate memory, so each parameter's slice is taken from the state that
last held that parameter. Layer-wise, a block is one parameter, so its whole state travels with it, the
compressor's included (SIDCo's stage count, PowerSGD's warm start): a rebuild, or a resume whose first step runs
DDP's initial buckets, changes nothing of what is computed. With one block per bucket the new bucket's compressor
state starts fresh (a stage count or a low-rank factor of another set of parameters means nothing for it). A
bucket-wise resume whose first step runs DDP's initial buckets on other parameters than the saved ones compresses
that step over the saved buckets (:mod:`gradstat.compressors.ddp.resume`), so it too resumes identically; where it
cannot (``exchange="allreduce"``), that step compresses other blocks than an uninterrupted run, and the hook says so
(a ``RuntimeWarning``). States not used for two steps are dropped.

``state_dict()`` holds only tensors and plain Python values (``torch.save(..., weights_only=True)`` can read it);
``load_state_dict()`` restores it into a state built with the same compressor and feedback.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gradstat.compressors.base import Compressor, check_int
from gradstat.compressors.memory.send import Memory, WorkerState
from gradstat.compressors.schemes.dense import SmallDense

MEMORIES = ("residual", "velocity")
"""Per-coordinate memories of a block: the feedback residual and DGC's local velocity (re-sliced and carried over
when DDP changes its buckets)."""


def get_memory(w: WorkerState, name: str) -> torch.Tensor | None:
    return w.feedback.residual if name == "residual" else getattr(w, name, None)


def set_memory(w: WorkerState, name: str, value: torch.Tensor | None) -> None:
    if name == "residual":
        w.feedback.residual = value
    else:
        setattr(w, name, value)


OPTIONAL_SETTINGS = ("masking", "dense_below")
"""Settings a checkpoint may lack (saved before they existed): it is loaded whatever this hook's value."""

Granularity = Literal["bucket", "layer"]
Exchange = Literal["gather", "allreduce"]
Observer = Callable[[int, "BucketView"], None]


@dataclass
class Block:
    """One compressed unit of a bucket: ``buffer[start:end]`` with the seed key ``block`` (see the hook)."""

    block: int
    start: int
    end: int


@dataclass
class BucketView:
    """What an observer sees of one bucket before compression on this rank (views, not copies).

    params : positions of the bucket's parameters among the model's trainable parameters (None when unbound).
    grads : each parameter's local gradient (this rank's, before averaging and compensation), its own shape.
    residuals : each parameter's slice of the feedback residual before this step (None where there is none yet).
    """

    rank: int
    params: list[int] | None
    grads: list[torch.Tensor]
    residuals: list[torch.Tensor | None]


@dataclass
class BucketState:
    """signature : bucket key (parameter positions, or (index, shapes) when no model is bound); shapes : the
    parameters' shapes; blocks : one worker state per block; last_step : the last step that used it; index : DDP's
    index of the bucket that last used it (a whole bucket's seed key), None before."""

    signature: tuple
    shapes: list[tuple[int, ...]]
    blocks: list[WorkerState]
    last_step: int = -1
    index: int | None = None

    def residual_of(self, j: int) -> torch.Tensor | None:
        """Parameter j's slice of the residual (its own shape), or None."""
        return self.memory_of(j, "residual")

    def memory_of(self, j: int, name: str) -> torch.Tensor | None:
        """Parameter j's slice of memory ``name`` (``MEMORIES``), in its own shape, or None."""
        if len(self.blocks) == len(self.shapes) and len(self.shapes) > 1:
            r = get_memory(self.blocks[j], name)
            return None if r is None else r.reshape(self.shapes[j])
        r = get_memory(self.blocks[0], name)
        if r is None:
            return None
        start = sum(math.prod(s) for s in self.shapes[:j])
        return r.reshape(-1)[start : start + math.prod(self.shapes[j])].view(self.shapes[j])


@dataclass
class StepMetrics:
    """This rank's totals over the buckets of one step.

    bits : exact payload bits (``Payload.bits`` summed over blocks); wire_bytes : serialised bytes (header and
    last-byte padding included); sent_bytes : bytes handed to the collectives (padded messages, length exchanges,
    or the all-reduced buffer); hook_seconds : time inside the hook and its callbacks; buckets : buckets seen;
    dense_blocks : blocks sent dense (:attr:`HookSettings.dense_below`);
    blocks : this rank's payload per block key (the parameter's position in layer-wise mode, else the bucket
    index) as ``(bits, wire_bytes)``.
    """

    bits: int = 0
    wire_bytes: int = 0
    sent_bytes: int = 0
    hook_seconds: float = 0.0
    buckets: int = 0
    dense_blocks: int = 0
    blocks: dict[int, tuple[int, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class HookSettings:
    """What a compression hook runs, fixed for the run.

    compressor : any registered compressor, or None for plain all-reduce (the baseline, instrumented alike).
    memory : error feedback around the compressor, optionally over DGC's local momentum correction (Lin et al.
        2018, Sec. 3.2-3.3; :class:`~gradstat.compressors.memory.send.Memory`).
    process_group : the group to communicate in (None: the default group).
    seed : base seed of the compressors' randomness (the same on every rank; ranks differ by ``worker = rank``).
    granularity : ``bucket`` (one block per bucket, or per parameter slice for a compressor whose method is per
        parameter: PowerSGD) or ``layer`` (one block per parameter slice).
    exchange : ``gather`` (serialised payloads, padded all-gather; every compressor) or ``allreduce`` (each rank
        all-reduces its own decoded message densely; not for side-information schemes).
    dense_below : blocks (a bucket, or a parameter's slice layer-wise) of fewer elements are sent dense, at the
        gradient's width (:class:`~gradstat.compressors.schemes.dense.SmallDense`); so are blocks the compressor
        cannot compress whatever this is (fewer than ``compressor.min_numel()``: a sparsifier keeping < 1 element).
        0 (default): only those.
    """

    compressor: Compressor | None
    memory: Memory = field(default_factory=Memory)
    process_group: dist.ProcessGroup | None = None
    seed: int = 0
    granularity: Granularity = "bucket"
    exchange: Exchange = "gather"
    dense_below: int = 0

    def __post_init__(self) -> None:
        if self.granularity not in ("bucket", "layer"):
            raise ValueError(f"granularity must be 'bucket' or 'layer', got {self.granularity!r}")
        if self.exchange not in ("gather", "allreduce"):
            raise ValueError(f"exchange must be 'gather' or 'allreduce', got {self.exchange!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.compressor is None and self.memory.active:
            raise ValueError(
                "error feedback and local momentum need a compressor (plain all-reduce has no compression error)"
            )
        if self.exchange == "allreduce" and self.compressor is not None and self.compressor.properties.needs_side:
            raise ValueError(f"{self.compressor.name} decodes with side information: it needs exchange='gather'")
        check_int("dense_below", self.dense_below, 0)

    @functools.cached_property
    def codec(self) -> SmallDense | None:
        """The compressor as the hook runs it: :attr:`compressor`, with blocks below ``dense_below`` (or below
        what it can compress) sent dense; None for plain all-reduce."""
        return None if self.compressor is None else SmallDense(self.compressor, self.dense_below)

    def describe(self) -> dict[str, Any]:
        """What a checkpoint must agree on (plain values)."""
        fb, m = self.memory.feedback, self.memory.momentum
        return {
            "compressor": None if self.compressor is None else self.compressor.spec(),
            "feedback": [fb.compensation, fb.decay],
            "granularity": self.granularity,
            "momentum": None if m is None else m.momentum,
            "masking": None if m is None else m.masking,
            "dense_below": self.dense_below,
        }


@dataclass
class HookTaps:
    """What a hook shows outside its computation on one rank.

    observers : called with ``(step, BucketView)`` for every bucket before compression (the per-rank recorder).
    keep_payloads : keep every (rank, block)'s received payload and decoded tensor of the last step in ``last``
        (for tests and inspection; ``last[(rank, block)] = (payload, decoded)``).
    """

    observers: list[Observer] = field(default_factory=list)
    keep_payloads: bool = False
    last: dict[tuple[int, int], tuple[Any, torch.Tensor]] = field(default_factory=dict)


@dataclass
class BucketMemories:
    """The run-time state of a hook on one rank: the step counter and every bucket's memories.

    compressor : the compressor whose ``new_state()`` starts a block's compressor state (None: no compression).
    step : the next step's number; buckets : bucket states by key (see :func:`_key`); rebuilds : how often DDP
    changed its buckets; param_index : ``id(parameter) -> position`` once bound to a model (:meth:`bind`);
    resumed : the keys of the buckets the loaded state's last step used (:meth:`load_state_dict`), until the first
    step after it ends;
    regroup : that step's regrouping onto the loaded buckets while it runs
    (:class:`~gradstat.compressors.ddp.resume.Regroup`).
    """

    compressor: Compressor | None = None
    step: int = 0
    buckets: dict[tuple, BucketState] = field(default_factory=dict)
    rebuilds: int = 0
    param_index: dict[int, int] | None = None
    resumed: set[tuple] | None = None
    regroup: Any = None

    def bind(self, model: nn.Module) -> None:
        """Name parameters by their position among ``model``'s trainable parameters (stable across processes and
        checkpoints): bucket signatures and layer-wise seeds use it."""
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.param_index = {id(p): i for i, p in enumerate(trainable)}

    def positions(self, params: Sequence[torch.Tensor]) -> list[int] | None:
        if self.param_index is None:
            return None
        try:
            return [self.param_index[id(p)] for p in params]
        except KeyError:
            raise ValueError("a bucket holds a parameter of another model than the one bound to this state") from None

    def bucket_state(
        self, signature: tuple, shapes: list[tuple[int, ...]], blocks: int, step: int, granularity_layer: bool
    ) -> BucketState:
        """The state of the bucket with ``signature``. The same parameters in another order keep their state
        (the residual is re-sliced to the new order); a bucket with other parameters gets a fresh one (residual
        carried over per parameter, compressor state new)."""
        key = _key(signature)
        if self.resumed is not None and not granularity_layer and key not in self.resumed:
            self._warn_resumed_buckets()
        current = self.buckets.get(key)
        if current is not None and self._superseded(current):
            current = None  # e.g. a resumed run's saved buckets, after a first step on DDP's initial ones
        if current is not None and len(current.blocks) == blocks and current.signature != signature:
            self._reorder(current, signature, list(shapes), granularity_layer)
        if current is None or len(current.blocks) != blocks:
            if any(b.last_step < step for b in self.buckets.values()):  # DDP used other buckets before
                self.rebuilds += 1
            current = BucketState(signature, list(shapes), [self.new_worker_state() for _ in range(blocks)])
            self._carry(current, granularity_layer)
            self.buckets[key] = current
        current.last_step = step
        return current

    def _superseded(self, state: BucketState) -> bool:
        """Whether a later step's state holds one of ``state``'s parameters (then ``state``'s memories are old)."""
        if not isinstance(state.signature[0], int):
            return False
        mine = set(state.signature)
        return any(b.last_step > state.last_step and not mine.isdisjoint(b.signature) for b in self.buckets.values())

    def _reorder(self, state: BucketState, signature: tuple, shapes: list[tuple[int, ...]], layer: bool) -> None:
        old = {pos: j for j, pos in enumerate(state.signature)}
        if layer:
            state.blocks = [state.blocks[old[pos]] for pos in signature]
        else:
            for name in MEMORIES:
                slices = [state.memory_of(old[pos], name) for pos in signature]
                if all(r is not None for r in slices):
                    set_memory(state.blocks[0], name, torch.cat([r.reshape(-1) for r in slices]))  # type: ignore[union-attr]
        state.signature, state.shapes = signature, shapes

    def _warn_resumed_buckets(self) -> None:
        """Say once that a bucket-wise resume runs its first step on other blocks than the saved run did."""
        warnings.warn(
            f"the hook state was saved with {len(self.resumed or ())} DDP bucket(s), and DDP's first step after the "
            "restart runs its initial buckets, which hold other parameters; this step cannot be compressed over the "
            "saved buckets (that needs exchange='gather' and a checkpoint that records their DDP indices), so it "
            "compresses other blocks than an uninterrupted run would (their compressor states start anew; the "
            "error-feedback residuals carry over per parameter) and the resumed run is not bit-identical to it. "
            "granularity='layer', or exchange='gather', resumes identically with any buckets.",
            RuntimeWarning,
            stacklevel=3,
        )
        self.resumed = None

    def end_step(self, step: int) -> None:
        """Drop bucket states unused in steps ``step - 1`` and ``step``; end the first step after a resume."""
        self.resumed = None
        self.buckets = {k: b for k, b in self.buckets.items() if b.last_step >= step - 1}

    def _carry(self, fresh: BucketState, layer: bool) -> None:
        """Fill a fresh bucket state's memories, parameter by parameter, from the states that last held them;
        layer-wise also each parameter's compressor state (a copy)."""
        if self.param_index is None or not isinstance(fresh.signature[0], int):
            return
        donors = sorted(self.buckets.values(), key=lambda b: b.last_step, reverse=True)
        holders = [next((d for d in donors if _holds(d, pos)), None) for pos in fresh.signature]
        for name in MEMORIES:
            slices: list[torch.Tensor | None] = []
            for pos, d in zip(fresh.signature, holders, strict=True):
                found = None if d is None else d.memory_of(d.signature.index(pos), name)
                slices.append(None if found is None else found.detach().clone())
            if all(x is None for x in slices):
                continue
            device = next(x for x in slices if x is not None).device
            filled = [
                (x if x is not None else torch.zeros(shape)).to(device)
                for x, shape in zip(slices, fresh.shapes, strict=True)
            ]
            if layer:
                for w, r in zip(fresh.blocks, filled, strict=True):
                    set_memory(w, name, r)
            else:
                set_memory(fresh.blocks[0], name, torch.cat([r.reshape(-1) for r in filled]))
        if layer:
            for w, pos, d in zip(fresh.blocks, fresh.signature, holders, strict=True):
                if d is not None and len(d.blocks) == len(d.shapes):  # the holder's blocks are its parameters
                    w.compressor = copy.deepcopy(d.blocks[d.signature.index(pos)].compressor)

    def new_worker_state(self) -> WorkerState:
        return WorkerState(compressor=self.compressor.new_state() if self.compressor is not None else None)

    def state_dict(self) -> dict[str, Any]:
        """Step counter and every bucket's signature, memories and compressor states (tensors and plain values)."""
        return {
            "step": self.step,
            "rebuilds": self.rebuilds,
            "buckets": [
                {
                    "signature": list(b.signature),
                    "shapes": [list(x) for x in b.shapes],
                    "last_step": b.last_step,
                    "index": b.index,
                    "blocks": [
                        {"residual": w.feedback.residual, "velocity": w.velocity, "compressor": _plain(w.compressor)}
                        for w in b.blocks
                    ],
                }
                for b in self.buckets.values()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.rebuilds = int(state["step"]), int(state["rebuilds"])
        self.buckets = {}
        for b in state["buckets"]:
            blocks = []
            for saved in b["blocks"]:
                w = self.new_worker_state()
                w.feedback.residual = saved["residual"]
                w.velocity = saved.get("velocity")
                w.compressor = _restore(w.compressor, saved["compressor"])
                blocks.append(w)
            signature = tuple(tuple(x) if isinstance(x, list) else x for x in b["signature"])
            shapes = [tuple(x) for x in b["shapes"]]
            index = b.get("index")
            self.buckets[_key(signature)] = BucketState(
                signature, shapes, blocks, int(b["last_step"]), None if index is None else int(index)
            )
        latest = max((b.last_step for b in self.buckets.values()), default=-1)
        self.resumed = {k for k, b in self.buckets.items() if b.last_step == latest}  # the saved step's buckets


class CompressionHookState:
    """State of :func:`gradstat.compressors.ddp.hook.compression_hook` on one rank: ``settings``, ``memory``,
    ``metrics`` and ``taps`` (see the module docstring). Build it with
    :func:`gradstat.compressors.ddp.hook.make_hook`."""

    def __init__(self, settings: HookSettings, taps: HookTaps | None = None) -> None:
        self.settings = settings
        self.memory = BucketMemories(settings.compressor)
        self.metrics = StepMetrics()
        self.taps = taps if taps is not None else HookTaps()

    def bind(self, model: nn.Module) -> "CompressionHookState":
        """Bind the memories to ``model``'s parameters (:meth:`BucketMemories.bind`). Call before training."""
        self.memory.bind(model)
        return self

    def take_metrics(self) -> StepMetrics:
        """This step's metrics, and reset them for the next step."""
        out, self.metrics = self.metrics, StepMetrics()
        return out

    # -- checkpointing --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The settings a resumed run must share, the seed, and the memories (tensors and plain values only)."""
        return {**self.settings.describe(), "seed": self.settings.seed, **self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the saved seed included); the compressor, feedback, momentum and
        granularity must be the same."""
        mine = self.settings.describe()
        for key, value in mine.items():
            if key in state and state[key] != value or key not in state and key not in OPTIONAL_SETTINGS:
                raise ValueError(f"hook state was saved with {key}={state.get(key)!r}, this hook uses {value!r}")
        self.memory.load_state_dict(state)
        self.settings = dataclasses.replace(self.settings, seed=int(state["seed"]))


def _holds(state: BucketState, pos: int) -> bool:
    """Whether a bucket state of a bound model holds parameter ``pos``."""
    return isinstance(state.signature[0], int) and pos in state.signature


def _key(signature: tuple) -> tuple:
    """Bucket states are found by the set of parameters (positions sorted); unbound signatures as they are."""
    return tuple(sorted(signature)) if all(isinstance(x, int) for x in signature) else signature


def _plain(obj: Any) -> Any:
    """A compressor state as tensors and plain values (dataclass fields; deques as lists; dicts with plain keys)."""
    if obj is None or isinstance(obj, (int, float, str, bool, torch.Tensor)):
        return obj
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple, collections.deque)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict) and all(isinstance(k, (int, str)) for k in obj):
        return {k: _plain(v) for k, v in obj.items()}
    raise TypeError(f"cannot checkpoint a compressor state holding {type(obj).__name__}")


def _restore(fresh: Any, saved: Any) -> Any:
    """Fill a fresh compressor state (from ``new_state()``) with saved plain values."""
    if fresh is None or not dataclasses.is_dataclass(fresh):
        return saved if fresh is None else fresh
    for f in dataclasses.fields(fresh):
        value, current = saved[f.name], getattr(fresh, f.name)
        if isinstance(current, collections.deque):
            value = collections.deque((tuple(x) if isinstance(x, list) else x for x in value), maxlen=current.maxlen)
        setattr(fresh, f.name, value)
    return fresh
