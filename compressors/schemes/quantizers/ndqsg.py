"""NDQSG: nested dithered quantization of stochastic gradients, decoded with side information.

Source: DQSG/NDQSG (Abdi & Fekri), Sec. 2.2 and 3.2, eq. (6)-(9), Algorithm 2, Theorem 6. Nested quantizers Q1
(fine, step Delta1) and Q2 (coarse, Delta2 = k Delta1, integer k > 1). Encoder (6): ``t = alpha x + u``,
``u ~ U[-Delta1/2, Delta1/2]``, ``s = Q1(t) - Q2(t)``. Decoder with side information y (7):
``r = s - u - alpha y``, ``x_hat = y + alpha (r - Q2(r))``. Decoding fails for an element when x and y fall in
different coarse bins, ``|alpha (x - y) + e| > Delta2/2`` (Theorem 6); the estimate is then off by a multiple of
``alpha Delta2``.

Algorithm 2 as a :meth:`NDQSG.round`: workers ``0 .. p1-1`` (the group P1) send DQSG with step 1/M
(:class:`gradstat.compressors.schemes.quantizers.dqsg.DQSG`); the server averages them into g_tilde; each later worker
(P2) sends nested indices, decoded with the running average g_tilde as side information, which is then updated with the
decoded gradient. Failures are counted against the decode with perfect side information (the worker's own gradient,
known to the simulation only) and reported in ``RoundResult.info``; they are never sent.

Units: as in DQSG (Sec. 3.1) every worker scales by its own ``kappa = ||g||_inf`` (sent as one float32), so
Delta1, Delta2 are relative to [-1, 1] -- the reading under which the paper's experiment (Sec. 4: DQSG Delta = 1/2,
NDQSG Delta1 = 1/3, Delta2 = 1, indices in {-1, 0, 1}) makes sense; the side information is scaled by the same
kappa. Sent by a P2 worker: d codes of ``ceil(log2 k)`` bits (s / Delta1 taken modulo k: ``r - Q2(r)`` only
depends on s modulo Delta2, and for even k, ``Q1(t) - Q2(t)`` takes k + 1 values whose two extremes coincide
modulo Delta2), the scale, the seed.

The dither: by default the counter dither of (seed, index) (:mod:`gradstat.theory.kernels.counter_dither`), with a
P2 worker's encode and decode each one kernel (:mod:`gradstat.theory.kernels.nested`: the operations of eq. (6) and
(7) in one loop each); ``dither=torch`` draws it from torch's seeded generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from gradstat.compressors.base import Compressor, Properties, RoundResult, check_int
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.quantizers.dither import DITHER_STREAM, DitherSource, draw_dither_scratch
from gradstat.compressors.schemes.quantizers.dqsg import DQSG
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.floats import NARROW_FLOATS, to_wire, widened
from gradstat.compressors.wire.payload import Payload, code_width
from gradstat.theory.kernels import counter_dither, counter_native
from gradstat.theory.kernels.nested import (
    NESTED_KERNELS,
    nested_decode,
    nested_encode,
)
from gradstat.theory.kernels.primitives import all_finite, max_abs, scratch, scratch_like


@register("ndqsg")
@dataclass
class NDQSG(Compressor):
    """p1: workers 0..p1-1 form the group P1 and send DQSG with step 1/M; the others (P2) send nested indices.
    delta1, delta2: fine and coarse steps of P2 (delta2/delta1 an integer k > 1, up to 1e-5 relative, so that
    spec strings may write 1/3 as 0.333333). alpha: shrinkage factor in (0, 1]. dither: ``counter`` (default) or
    ``torch``, for both groups (see :class:`gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer`)."""

    defers_checks = True  # (its encode reads back only its finiteness checks)

    p1: int = 1
    M: int = 2
    delta1: float = 1.0 / 3.0
    delta2: float = 1.0
    alpha: float = 1.0
    dither: DitherSource = "counter"

    properties = Properties(
        kind="quantizer",
        unbiased=False,
        randomized=True,
        bound="ndqsg_no_failure",
        needs_side=True,
        source="DQSG/NDQSG (Abdi & Fekri) eq. (6)-(9), Algorithm 2, Theorem 6",
    )

    def __post_init__(self) -> None:
        check_int("ndqsg p1", self.p1, 1)
        check_int("ndqsg M", self.M, 1)
        if not (self.delta1 > 0 and self.delta2 > 0) or math.isinf(self.delta1) or math.isinf(self.delta2):
            raise ValueError(f"ndqsg delta1 and delta2 must be finite and > 0, got {self.delta1}, {self.delta2}")
        ratio = self.delta2 / self.delta1
        if round(ratio) < 2 or abs(ratio - round(ratio)) > 1e-5 * ratio:
            raise ValueError(
                f"ndqsg delta2/delta1 must be an integer k > 1 (nested quantizers), got "
                f"{self.delta2}/{self.delta1} = {ratio:.6g}"
            )
        if not (0.0 < self.alpha <= 1.0):
            raise ValueError(f"ndqsg alpha must lie in (0, 1], got {self.alpha}")
        self._dqsg()  # checks M and the dither source (DQSG builds its quantizer)

    @property
    def nesting(self) -> int:
        """k = Delta2 / Delta1."""
        return round(self.delta2 / self.delta1)

    @property
    def fine_step(self) -> float:
        """Delta1 as used: Delta2 / k exactly."""
        return self.delta2 / self.nesting

    def _dqsg(self) -> DQSG:
        return DQSG(M=self.M, dither=self.dither)

    # -- one worker ------------------------------------------------------------------------------------------
    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        if ctx.worker < self.p1:
            self._dqsg()._encode(g, payload, ctx)
            return
        seed, k = ctx.call_seed, self.nesting
        kappa = max_abs(g).abs()  # = |g|.amax() without the |g| tensor (abs: +0, not -0, for an all-zero g)
        if payload.dtype in NARROW_FLOATS:  # sent in the gradient's 16 bits: rounded up, and encoded with as sent
            kappa = to_wire(kappa, payload.dtype, "ndqsg", "scale", up=True).to(kappa.dtype)
        safe = torch.where(kappa > 0, kappa, torch.ones_like(kappa))
        if self.dither == "counter":
            s = torch.empty(g.shape, dtype=torch.int8 if k <= 255 else torch.int32, device=g.device)
            key = counter_dither.keys(seed, DITHER_STREAM, g.device)
            if counter_native.nests(g, k, self.fine_step):  # the same arithmetic in one C loop
                counter_dither.check_indices(0, g.numel())
                counter_native.nested_rows_into(s, g, float(safe), key, self.alpha, self.fine_step, k)
            else:
                rows = (s.view(1, -1), g.view(1, -1), safe.reshape(1, 1))
                counter_dither.run_rows(NESTED_KERNELS[0], *rows, 0, key, self.alpha, self.fine_step, k)
        else:
            x = torch.div(g, safe, out=scratch_like(g, "scaled"))
            u = draw_dither_scratch(g.numel(), seed, g.device).mul_(self.fine_step)
            s = nested_encode(x, u, self.fine_step, k, self.alpha)
        payload.add("nested", s, code_width(k), "code")  # int8 (k <= 255) or int32 already
        payload.add_floats("scales", kappa.reshape(1), "scale", "ndqsg", "scale")
        payload.add_seed(seed)
        if self.dither == "torch":  # torch's draws differ between device types: the payload says whose they are
            payload.add_generator(g.device)

    def _check_payload(self, payload: Payload) -> None:
        if "nested" not in payload.parts:
            self._dqsg()._check_payload(payload)
            return
        payload.require("nested", numel=payload.numel, integer=True)
        payload.require("scales", numel=1, integer=False)
        payload.seed  # noqa: B018  (present, one integer: a PayloadError otherwise)

    def _proves_finite(self, payload: Payload) -> bool:
        if "nested" not in payload.parts:
            return self._dqsg()._proves_finite(payload)
        return True  # _decode reads its output: x_hat may exceed 1 in units of kappa

    def decode(self, payload: Payload, ctx: Context | None = None, side: torch.Tensor | None = None) -> torch.Tensor:
        """As :meth:`Compressor.decode`; only P2 (nested) payloads need ``side`` (the average gradient so far)."""
        if side is None and "nested" not in payload.parts:
            side = torch.zeros(0)  # a P1 (DQSG) payload: side information is not used
        return super().decode(payload, ctx, side)

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        if "nested" not in payload.parts:
            return self._dqsg()._decode(payload, ctx, None)
        if side is None or side.numel() != payload.numel:
            raise ValueError(
                f"ndqsg: side information must have {payload.numel} elements, got "
                f"{None if side is None else side.numel()}"
            )
        kappa = widened(payload["scales"])
        s = payload["nested"].reshape(-1)  # integer codes: s * Delta1 converts them exactly
        if s.numel() != payload.numel or kappa.numel() != 1:
            raise ValueError(
                f"ndqsg: the payload holds {s.numel()} nested codes and {kappa.numel()} scales for "
                f"{payload.numel} elements (was it encoded for another shape?)"
            )
        side = side.to(s.device)
        native = counter_native.nests(side, self.nesting, self.fine_step) and s.dtype == torch.int8
        if self.dither == "counter" and native and s.is_contiguous():  # the same arithmetic in one C loop
            counter_dither.check_indices(0, s.numel())
            key = counter_dither.keys(payload.seed, DITHER_STREAM, s.device)
            out = torch.empty(payload.numel, dtype=torch.float32, device=s.device)
            counter_native.nested_estimate_into(
                out, s, side, float(kappa), key, self.alpha, self.fine_step, self.nesting
            )
        elif self.dither == "counter":
            out = counter_dither.widened(s)  # the float32 conversion the loop made of each code
            key = counter_dither.keys(payload.seed, DITHER_STREAM, s.device)
            args = (0, key, self.alpha, self.fine_step, self.nesting)
            side_rows = side.to(s.device).view(1, -1)
            counter_dither.run_rows(NESTED_KERNELS[1], out.view(1, -1), side_rows, kappa.reshape(1, 1), *args)
        else:
            safe = torch.where(kappa > 0, kappa, torch.ones_like(kappa))
            u = draw_dither_scratch(payload.numel, payload.seed, s.device).mul_(self.fine_step)
            y = torch.div(side.to(s.device), safe, out=scratch(payload.numel, torch.float32, s.device, "scaled"))
            out = nested_decode(s, u, y, self.fine_step, self.nesting, self.alpha).mul_(kappa)
        if not all_finite(out):  # x_hat may exceed 1 in units of kappa: near float32's limit that overflows
            raise PayloadError(
                "ndqsg: the reconstruction exceeds float32's range (3.4e38) although each input was finite; "
                "scale the gradient down (e.g. by a power of two) before compressing"
            )
        return out

    # -- Algorithm 2 ------------------------------------------------------------------------------------------
    def decode_all(self, payloads: Sequence[Payload], ctx: Context | None = None) -> list[torch.Tensor]:
        """Every worker's reconstruction in the order of Algorithm 2 (see :meth:`_decode_in_order`)."""
        return self._decode_in_order(payloads, ctx or Context())[0]

    def _decode_in_order(self, payloads: Sequence[Payload], ctx: Context) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Algorithm 2's decoding: the P1 workers (below ``p1``) without side information, averaged; then each P2
        worker in order with the running average of all decoded so far as side information, which is then updated
        with it. Returns the reconstructions in worker order and the final running average."""
        if len(payloads) == 0:
            raise ValueError("ndqsg: no payloads to decode")
        p1 = min(self.p1, len(payloads))
        decoded = [self.decode(payloads[w], ctx.but(worker=w)) for w in range(p1)]
        side = torch.stack([d.float() for d in decoded]).mean(0)
        for w in range(p1, len(payloads)):
            out = self.decode(payloads[w], ctx.but(worker=w), side=side)
            decoded.append(out)
            side = side + (out.float() - side) / len(decoded)  # running average of all decoded so far
        return decoded, side

    def round(
        self, grads: Sequence[torch.Tensor], ctx: Context | None = None, states: Sequence[Any] | None = None
    ) -> RoundResult:
        """P1 workers send DQSG, the server averages them; each P2 worker is decoded with the running average as
        side information, which is then updated. ``info``: ``decoding_failures`` (0-d int64 tensor, all P2
        elements decoded in the wrong coarse bin), ``failures_per_worker`` ({worker: 0-d tensor}), ``p1``,
        ``p2`` (group sizes). A round needs at least one P1 worker."""
        ctx = ctx or Context()
        if len(grads) == 0:
            raise ValueError("ndqsg round: no gradients")
        payloads = [self.encode(g, ctx.but(worker=w)) for w, g in enumerate(grads)]
        decoded, side = self._decode_in_order(payloads, ctx)
        p1 = min(self.p1, len(grads))
        failures: dict[int, torch.Tensor] = {}
        for w in range(p1, len(grads)):
            oracle = self.decode(payloads[w], ctx.but(worker=w), side=grads[w])
            bin_half = 0.5 * self.alpha * self.delta2 * widened(payloads[w]["scales"])
            wrong_bin = (decoded[w].float() - oracle.float()).abs() > bin_half
            failures[w] = wrong_bin.sum()
        total = torch.stack(list(failures.values())).sum() if failures else torch.zeros((), dtype=torch.int64)
        info = {"decoding_failures": total, "failures_per_worker": failures, "p1": p1, "p2": len(grads) - p1}
        return RoundResult(mean=side.to(grads[0].dtype), decoded=decoded, payloads=payloads, info=info)
