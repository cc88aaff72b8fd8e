"""The worker's send step, written once: compensate -> encode -> decode -> update memory.

GRACE's five-line ``send_step``, with the memories of :mod:`gradstat.compressors.memory` around the compressor C:

    u = m * u + g                       (DGC's local momentum, :mod:`.velocity`; optional)
    z = u + compensation * h            (error feedback, :mod:`.feedback`: none, plain EF, QCS eq. (14), ECQ-SGD)
    payload = C.encode(z);  z_hat = C.decode(payload)     (the receiver's reconstruction, possibly remote)
    h <- decay * h + (z - z_hat);  u <- u * (z_hat == 0)  (memory update; masking only with DGC)

:meth:`Memory.begin` is the first half (it changes no state) and :meth:`InFlight.land` the second, so that a step
whose encode or exchange fails leaves every memory as it was. Everything that sends goes through these two:
:func:`send_step` and :func:`send_locally` (encode and decode here), :func:`feedback_round` (a round of P workers
through the compressor's own ``round``, so side-information schemes (NDQSG) and per-worker compressor state
(SIDCo's stage count) work unchanged), the simulated workers, the offline replays and the DDP hook (which decodes
what the other ranks sent between the two halves).

Specs: :func:`parse_memory` reads ``none`` | ``ef`` | ``qcs:beta=B`` | ``ecq:alpha=A,beta=B`` |
``weighted:compensation=C,decay=D`` | ``dgc:momentum=M,masking=true|false`` in the one spec grammar
(:mod:`gradstat.compressors.spec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from gradstat.compressors.base import Compressor, RoundResult
from gradstat.compressors.context import Context
from gradstat.compressors.memory.feedback import ErrorFeedback, FeedbackState, parse_feedback
from gradstat.compressors.memory.velocity import LocalMomentum
from gradstat.compressors.spec import convert, parse_spec
from gradstat.compressors.wire.payload import Payload

MOMENTUM_SPEC = "dgc"
"""The memory spec name of DGC's local momentum correction (plain error feedback underneath)."""


@dataclass
class WorkerState:
    """Everything one worker carries across steps: its feedback residual, DGC's velocity (None until the first
    step, and without DGC's momentum) and its compressor's state."""

    feedback: FeedbackState = field(default_factory=FeedbackState)
    compressor: Any = None
    velocity: torch.Tensor | None = None


@dataclass(frozen=True)
class Memory:
    """The memories a worker keeps around its compressor: error feedback, optionally over DGC's local momentum."""

    feedback: ErrorFeedback = field(default_factory=ErrorFeedback.none)
    momentum: LocalMomentum | None = None

    @classmethod
    def of(cls, memory: "Memory | ErrorFeedback | str") -> "Memory":
        """``memory`` itself, an error feedback with no momentum, or a spec for :func:`parse_memory`."""
        if isinstance(memory, Memory):
            return memory
        if isinstance(memory, ErrorFeedback):
            return cls(memory)
        if isinstance(memory, str):
            return parse_memory(memory)
        raise TypeError(f"expected a Memory, an ErrorFeedback or a spec string, got {type(memory).__name__}")

    @property
    def active(self) -> bool:
        """Whether anything is carried across steps."""
        return self.momentum is not None or self.feedback.compensation != 0.0 or self.feedback.decay != 0.0

    def new_states(self, compressor: Compressor | None, workers: int) -> list[WorkerState]:
        """Fresh states for ``workers`` workers (no residual, no velocity, ``compressor.new_state()``)."""
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        return [WorkerState(compressor=None if compressor is None else compressor.new_state()) for _ in range(workers)]

    def begin(self, grads: Sequence[torch.Tensor], states: Sequence[WorkerState]) -> "InFlight":
        """First half of the step for each worker: the velocity (DGC) and the compensated gradient ``z`` that is
        encoded. No state changes here."""
        if len(states) != len(grads):
            raise ValueError(f"{len(grads)} gradients but {len(states)} worker states")
        velocities = [
            None if self.momentum is None else self.momentum.accumulate(s.velocity, g)
            for g, s in zip(grads, states, strict=True)
        ]
        compensated = [
            self.feedback.compensate(g if u is None else u, s.feedback)
            for g, u, s in zip(grads, velocities, states, strict=True)
        ]
        return InFlight(self, list(states), compensated, velocities)


@dataclass
class InFlight:
    """A step between its two halves: ``compensated[w]`` is what worker w encodes."""

    memory: Memory
    states: list[WorkerState]
    compensated: list[torch.Tensor]
    velocities: list[torch.Tensor | None]

    def land(self, decoded: Sequence[torch.Tensor]) -> None:
        """Second half: each worker's memories from its reconstruction ``decoded[w]`` (what the receivers got)."""
        if len(decoded) != len(self.states):
            raise ValueError(f"{len(decoded)} reconstructions for {len(self.states)} workers")
        fb, momentum = self.memory.feedback, self.memory.momentum
        for z, z_hat, u, s in zip(self.compensated, decoded, self.velocities, self.states, strict=True):
            fb.update(z, z_hat, s.feedback)
            if momentum is not None and u is not None:
                s.velocity = momentum.masked(u, z_hat)


def new_worker_states(compressor: Compressor, workers: int) -> list[WorkerState]:
    """Fresh states for ``workers`` workers (residual zero, compressor state from ``compressor.new_state()``)."""
    return Memory().new_states(compressor, workers)


@dataclass
class Sent:
    """What a step sent: each sender's compensated gradient ``z``, payload and reconstruction ``z_hat``."""

    compensated: list[torch.Tensor]
    payloads: list[Payload]
    decoded: list[torch.Tensor]


def send_locally(
    compressor: Compressor,
    memory: Memory | ErrorFeedback,
    grads: Sequence[torch.Tensor],
    states: Sequence[WorkerState],
    ctxs: Sequence[Context],
) -> Sent:
    """The step of several independent senders (blocks of one worker, or workers without side information), each
    decoded where it was encoded, with ``ctxs[i]`` (its ``state`` replaced by ``states[i].compressor``). Memories
    change only when every encode and decode succeeded."""
    if len(ctxs) != len(grads):
        raise ValueError(f"{len(grads)} gradients but {len(ctxs)} contexts")
    flight = Memory.of(memory).begin(grads, states)
    payloads, decoded = [], []
    for z, s, ctx in zip(flight.compensated, states, ctxs, strict=True):
        c = ctx.but(state=s.compressor)
        payloads.append(compressor.encode(z, c))
        decoded.append(compressor.decode(payloads[-1], c))
    flight.land(decoded)
    return Sent(flight.compensated, payloads, decoded)


def send_step(
    compressor: Compressor,
    memory: Memory | ErrorFeedback,
    g: torch.Tensor,
    state: WorkerState,
    ctx: Context | None = None,
) -> tuple[Payload, torch.Tensor]:
    """One worker's step: returns the payload it sends and the reconstruction ``z_hat`` the receiver gets;
    ``state`` is updated in place."""
    sent = send_locally(compressor, memory, [g], [state], [ctx or Context()])
    return sent.payloads[0], sent.decoded[0]


def feedback_round(
    compressor: Compressor,
    memory: Memory | ErrorFeedback,
    grads: Sequence[torch.Tensor],
    states: Sequence[WorkerState],
    ctx: Context | None = None,
) -> RoundResult:
    """One synchronous round over P workers: each worker's first half, the compressor's ``round`` (encode,
    decode, average), each worker's second half from its own reconstruction. ``states`` (one per worker) are
    updated in place."""
    return send_round(compressor, memory, grads, states, ctx)[1]


def send_round(
    compressor: Compressor,
    memory: Memory | ErrorFeedback,
    grads: Sequence[torch.Tensor],
    states: Sequence[WorkerState],
    ctx: Context | None = None,
) -> tuple[list[torch.Tensor], RoundResult]:
    """:func:`feedback_round`, also returning what each worker encoded (its compensated gradient ``z``)."""
    flight = Memory.of(memory).begin(grads, states)
    result = compressor.round(flight.compensated, ctx, [s.compressor for s in states])
    flight.land(result.decoded)
    return flight.compensated, result


def parse_memory(spec: str) -> Memory:
    """A memory spec: an error feedback spec (:func:`gradstat.compressors.memory.feedback.parse_feedback`) or
    ``dgc`` | ``dgc:momentum=M,masking=true|false`` (DGC's local momentum correction over plain error feedback;
    momentum 0.9 and masking on unless given)."""
    name, raw = parse_spec(spec, "feedback")
    if name != MOMENTUM_SPEC:
        return Memory(parse_feedback(spec))
    types = {"momentum": float, "masking": bool}
    unknown = sorted(set(raw) - set(types))
    if unknown:
        raise ValueError(f"feedback {name!r}: unknown parameter(s) {unknown}; accepted: momentum, masking")
    args = {k: convert(v, types[k], f"{name}:{k}") for k, v in raw.items()}
    return Memory(ErrorFeedback.plain(), LocalMomentum(**args))
