"""Dense sending of the tensors a compressor should not (or cannot) compress: biases, norms, tiny buckets.

A model's small tensors (biases and normalisation weights of 32-768 elements) are a negligible share of its bits,
but a sparsifier with target density delta cannot compress a vector of fewer than ``1 / delta`` elements (it would
keep less than one; :meth:`~gradstat.compressors.base.Compressor.min_numel`). Like torch's PowerSGD hook, which
sends 1-D tensors uncompressed, such a tensor is sent dense:

- :class:`Dense`: the identity codec, every value at the gradient's own width (16 bits for bf16 and fp16, 32 for
  float32, 64 for float64), ``numel * width`` bits, decoded exactly;
- :class:`SmallDense`: a compressor that sends a tensor with :class:`Dense` when it holds fewer than
  ``max(dense_below, inner.min_numel())`` elements or ``inner`` does not compress its shape
  (:meth:`~gradstat.compressors.base.Compressor.compresses`: PowerSGD's vectors, as torch's hook), and with
  ``inner`` otherwise. Sender and receiver know every tensor's shape, so the choice is not sent; the bits count
  what is sent either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from gradstat.compressors.base import Compressor, Properties, RoundResult, check_int
from gradstat.compressors.context import Context
from gradstat.compressors.pending import Pending
from gradstat.compressors.wire.payload import Payload, float_width


@dataclass
class Dense(Compressor):
    """Every value, at the gradient's own floating-point width: exact, ``numel * width`` bits."""

    name = "dense"
    properties = Properties(
        kind="identity",
        unbiased=True,
        randomized=False,
        contraction="1",
        source="no compression (torch's PowerSGD hook sends 1-D tensors so)",
    )

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        values = g.to(payload.dtype)  # g was widened from payload.dtype by encode: exact
        payload.add("values", values, float_width(payload.dtype), "value")

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        values = payload["values"].reshape(-1)
        return values if values.dtype == torch.float64 else values.float()

    def _check_payload(self, payload: Payload) -> None:
        payload.require("values", numel=payload.numel, integer=False)


class SmallDense(Compressor):
    """``inner`` for tensors of at least :attr:`threshold` elements whose shape ``inner`` compresses, :class:`Dense`
    for the others.

    threshold : ``max(dense_below, inner.min_numel())``; ``dense_below`` is the caller's declared size (0: only
    the tensors ``inner`` cannot compress). Everything else (properties, state, spec) is ``inner``'s."""

    def __init__(self, inner: Compressor, dense_below: int = 0) -> None:
        self.inner = inner
        self.dense = Dense()
        self.dense_below = check_int("dense_below", dense_below, 0)
        self.threshold = max(self.dense_below, inner.min_numel())
        self.properties = inner.properties

    def sends_dense(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of ``shape`` is sent dense."""
        return math.prod(shape) < self.threshold or not self.inner.compresses(tuple(shape))

    @property
    def per_parameter(self) -> bool:
        return self.inner.per_parameter

    def _pick(self, shape: tuple[int, ...]) -> Compressor:
        return self.dense if self.sends_dense(shape) else self.inner

    def enqueue(self, g: torch.Tensor, ctx: Context | None = None) -> Pending:
        return self._pick(tuple(g.shape)).enqueue(g, ctx)

    def decode(self, payload: Payload, ctx: Context | None = None, side: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(payload, Payload):
            raise TypeError(f"{self.inner.name}: decode expects a Payload, got {type(payload).__name__}")
        codec = self._pick(tuple(payload.shape))
        return codec.decode(payload, ctx, side if codec is self.inner else None)

    def decode_all(self, payloads: Sequence[Payload], ctx: Context | None = None) -> list[torch.Tensor]:
        if payloads and self.sends_dense(tuple(payloads[0].shape)):
            return self.dense.decode_all(payloads, ctx)
        return self.inner.decode_all(payloads, ctx)

    def round(
        self, grads: Sequence[torch.Tensor], ctx: Context | None = None, states: Sequence[Any] | None = None
    ) -> RoundResult:
        return self._pick(tuple(grads[0].shape)).round(grads, ctx, states)

    def new_state(self, like: torch.Tensor | None = None) -> Any:
        return self.inner.new_state(like)

    def min_numel(self) -> int:
        return 1

    def spec(self) -> str:
        return self.inner.spec()

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:  # pragma: no cover (encode picks)
        raise NotImplementedError("SmallDense.encode hands every tensor to Dense or the inner compressor")

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError("SmallDense.decode hands every payload to Dense or the inner compressor")
