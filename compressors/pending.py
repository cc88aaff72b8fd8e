"""An encode queued on the device whose payload is read back later: :meth:`Compressor.enqueue`'s result.

A sparsifier's payload holds as many elements as its rule selects, a number only the device knows until it is read
back. Reading it inside the encode makes the host wait for every kernel queued so far, once per such read, and
leaves the device idle while the host then queues the next kernels. :meth:`Compressor.enqueue
<gradstat.compressors.base.Compressor.enqueue>` instead queues the whole encode without reading anything (where the
compressor has such a form: the threshold sparsifiers on a device, see
:meth:`~gradstat.compressors.schemes.sparsifiers.threshold.ThresholdSparsifier._enqueue`) and returns a
:class:`Pending`; :meth:`Pending.payload` then reads back, in one copy, everything the rest needs (the count, the
checks, the diagnostics) and assembles the :class:`~gradstat.compressors.wire.payload.Payload`. That read is the one
the wire needs anyway: a message's length must be known on the host before it is sent.

A caller with several tensors to send (a bucket's layers) queues them all first and then reads each: the device
runs the first tensor's kernels while the host queues the next tensor's, and the host waits once.

A compressor whose message size is fixed, and whose encode of a float32 gradient reads nothing back but its checks
that the gradient and what it sends are finite (the quantizers, random-k, top-k: ``defers_checks``), is queued by
running its encode with those checks deferred (:func:`deferring`, :func:`finite`): each check leaves its answer on
the device and is assumed to pass; the answers are read back with the payload, and where one failed the synchronous
encode runs again and raises its error.

A compressor's per-worker state is read when an encode is queued and updated when its payload is read back (SIDCo's
adaptive stage count): two encodes sharing one state are read back in turn before the next is queued (the DDP
hook queues one block per state). The gradient given to ``enqueue`` must not change until :meth:`Pending.payload`
has returned: where the device form does not represent an input (a non-finite or all-zero gradient, a selection
larger than its buffer, a fit that needs the synchronous path's checks), settling re-runs the synchronous encode on
it, which raises the usual errors.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import torch

from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels.primitives import all_finite, finite_flag

_DEFERRED: contextvars.ContextVar[list[torch.Tensor] | None] = contextvars.ContextVar("gradstat_deferred", default=None)


@contextlib.contextmanager
def deferring() -> Iterator[list[torch.Tensor]]:
    """While the block runs, :func:`finite` keeps its checks on the device: the list it yields collects their
    answers (0-d bool tensors), to be read back later."""
    flags: list[torch.Tensor] = []
    token = _DEFERRED.set(flags)
    try:
        yield flags
    finally:
        _DEFERRED.reset(token)


def finite(x: torch.Tensor) -> bool:
    """Whether every element of ``x`` is finite (:func:`~gradstat.theory.kernels.primitives.all_finite`: one read
    back); inside :func:`deferring`, True at once, the answer kept on the device for the caller to read back."""
    flags = _DEFERRED.get()
    if flags is None:
        return all_finite(x)
    flags.append(finite_flag(x))
    return True


def holds(flag: torch.Tensor) -> bool:
    """Whether the 0-d bool ``flag`` (a device-side condition of a fast form, e.g. a buffer that held enough) is
    true: read back at once (one synchronisation); inside :func:`deferring`, True at once, the flag kept with the
    finiteness checks' answers, whose read back runs the synchronous encode again where one is false."""
    flags = _DEFERRED.get()
    if flags is None:
        return bool(flag)
    flags.append(flag)
    return True


class Pending:
    """A payload being encoded: :meth:`payload` finishes it (once; later calls return the same payload).

    ``finish`` reads back what the queued encode left on the device and returns the payload; it runs at most once,
    and an exception it raises (e.g. a non-finite gradient) is raised again by every later :meth:`payload` call."""

    def __init__(self, finish: Callable[[], Payload]) -> None:
        self._finish: Callable[[], Payload] | None = finish
        self._payload: Payload | None = None
        self._error: BaseException | None = None

    @classmethod
    def ready(cls, payload: Payload) -> Pending:
        """A payload already complete (a compressor without a queued form, or a host-side encode)."""
        pending = cls(lambda: payload)
        pending._payload, pending._finish = payload, None
        return pending

    @property
    def settled(self) -> bool:
        """Whether :meth:`payload` has run (nothing left to read back)."""
        return self._finish is None

    def payload(self) -> Payload:
        """The finished payload: reads back the queued encode's results on the first call (one host copy)."""
        if self._error is not None:
            raise self._error
        if self._finish is not None:
            finish, self._finish = self._finish, None
            try:
                self._payload = finish()
            except BaseException as exc:
                self._error = exc
                raise
        assert self._payload is not None
        return self._payload
