"""The compressor contract.

A compressor is ``encode(g, ctx) -> Payload`` and ``decode(payload, ctx, side=None) -> Tensor`` around a wire
format (:mod:`gradstat.compressors.wire.payload`), with explicit per-worker state (``new_state``) and seeded
randomness (:mod:`gradstat.compressors.context`). Subclasses implement ``_encode``/``_decode`` on a flat 1-D float
tensor; this base class checks the input once (1-D or any shape, finite, floating dtype), flattens, and restores
shape and dtype.

Rules for implementations:
- no ``.item()``, ``.cpu()`` or numpy inside ``_encode``/``_decode`` except where the algorithm itself needs a
  scalar decision (say so in a comment);
- randomness from the counter hash keyed by ``(seed, index)`` (:mod:`gradstat.theory.kernels.counter_dither`),
  the same numbers on every device; the seed actually used is sent as a ``seed`` part of ``SEED_BITS`` bits. A
  scheme that draws from torch's per-device generator instead (``dither=torch``) records it
  (``Payload.add_generator``) and its decoder refuses another device (``Payload.check_generator``);
- ``_check_payload`` states the parts ``_decode`` reads, ``_proves_finite`` when its output is finite without a
  read of it (:meth:`Compressor.decode` checks both: a payload is untrusted input);
- ``Payload.bits`` must equal a hand count of what is sent.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import Field, dataclass, fields, is_dataclass
from typing import Any, ClassVar, Literal, Mapping, Sequence

import torch

from gradstat.compressors import graphs
from gradstat.compressors.context import Context
from gradstat.compressors.pending import Pending, deferring, finite
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.payload import Payload
from gradstat.theory import scalars as S
from gradstat.theory.kernels.primitives import all_finite, forget_extremes

Kind = Literal["sparsifier", "quantizer", "sketch", "identity"]


@dataclass(frozen=True)
class Properties:
    """What a compressor declares about itself; the generic test battery holds it to these claims.

    unbiased : E[decode(encode(g))] = g for every g (checked by Monte Carlo).
    kind : sparsifier, quantizer, sketch (QCS) or identity.
    randomized : draws random numbers (then a separately built decoder must reproduce it from the seed).
    contraction : a bound ``E||C(g) - g||^2 <= (1 - c) ||g||^2`` holds with the named constant, if any
        (e.g. ``"1 - delta"`` for Top-k); None when no such claim is made.
    bound : name of the theory bound on ``E||C(g) - g||^2 / ||g||^2`` that applies (a key understood by the
        analysis layer, e.g. ``"qcs_gamma"``, ``"dqsg_exact"``, ``"qsgd"``, ``"topk_contraction"``), or None.
        Quantizer keys (n: bucket/partition/block length, L: positive levels, kappa_b: a bucket's l_inf norm):
        ``qsgd``: <= min(n/s^2, sqrt(n)/s) (Alistarh et al. Lemma 3.1; QSGD, ECQ with l2 scale);
        ``half_dither_linf``: E||e||^2 <= sum_b kappa_b^2 n_b / (4 L^2) (TernGrad, ECQ l_inf, half-dithered
        DQSG; exact value ``expected_error``); ``dqsg_exact``: E||e||^2 = sum_b kappa_b^2 n_b Delta^2 / 12
        (DQSG/NDQSG (Abdi & Fekri) Lemma 3); ``qcs_gamma``: <= gamma of QCS (Abdi & Fekri) eq. (10)
        (range 1/2 for 1-bit QCS); ``qcs_mmse``: <= 1 - alpha (Lemma 3); ``ndqsg_no_failure``: per element
        alpha^2 Delta1^2/12 + (1 - alpha^2)^2 sigma_z^2 in units of kappa^2 when no decoding fails (eq. (9)).
    needs_side : decode needs side information (NDQSG).
    source : paper file and equation/section this implements.
    """

    kind: Kind
    unbiased: bool
    randomized: bool
    contraction: str | None = None
    bound: str | None = None
    needs_side: bool = False
    source: str = ""


class Compressor(ABC):
    """Base class of every compressor. Hyper-parameters are dataclass fields of the subclass (typed, with
    defaults), which is what the registry's spec strings set."""

    name: ClassVar[str] = ""
    # Declared by each subclass as a class attribute (read from the class by the registry and the CLI). Not a
    # ClassVar: an instance whose hyper-parameters change a declared property (e.g. terngrad with clipping is
    # biased) stores its own narrowed copy, which then shadows the class default for that instance only.
    properties: Properties

    # -- public API -----------------------------------------------------------------------------------------
    def encode(self, g: torch.Tensor, ctx: Context | None = None) -> Payload:
        """Encode ``g`` (any shape, floating dtype, finite). Returns the payload; ``payload.bits`` is exact."""
        return self.enqueue(g, ctx).payload()

    def enqueue(self, g: torch.Tensor, ctx: Context | None = None) -> Pending:
        """Queue the encode of ``g`` and return it pending (:mod:`gradstat.compressors.pending`): where the
        compressor has a queued form for this input (:meth:`_enqueue`), nothing is read back to the host until
        :meth:`Pending.payload <gradstat.compressors.pending.Pending.payload>`; elsewhere the encode runs now and
        the result is already complete. ``g`` must not change until the payload is read."""
        ctx = ctx or Context()
        flat = check_gradient(g, self.name, finite=False).detach()  # compression is not differentiable
        x = flat.float() if flat.dtype != torch.float64 else flat
        payload = Payload(shape=g.shape, dtype=g.dtype)
        try:
            finish = self._enqueue(x, payload, ctx)
        finally:
            forget_extremes()  # (extremes a queued device part's max_abs kept serve that encode only, as below)
        if finish is not None:
            return Pending(finish)
        if self.defers_checks and not S.on_host(x) and x.dtype == torch.float32 and g.dtype == torch.float32:
            return Pending(self._checks_deferred(x, payload, ctx))
        return Pending.ready(self._encode_now(x, payload, ctx))

    defers_checks: ClassVar[bool] = False
    """Whether the encode of a float32 gradient reads nothing back but its finiteness checks
    (:func:`gradstat.compressors.pending.finite`), so that on a device it is queued with them deferred
    (:meth:`_checks_deferred`). Held by the tests that run the encode on meta tensors
    (tests/compressors/test_queued_encode.py). Other dtypes encode at once: a 16-bit gradient's scales and a float64
    one's values are narrowed to the wire's dtype by a conversion that checks its range on the host."""

    def _checks_deferred(self, x: torch.Tensor, payload: Payload, ctx: Context) -> Callable[[], Payload]:
        """Run the encode with its finiteness checks kept on the device (assumed to pass), directly or as a CUDA
        graph's replay (:mod:`gradstat.compressors.graphs`, where :meth:`_graph_key` gives a key), and return the
        function that reads their answers back: the payload where every one passed (a replay's copied out of the
        graph's memory, with this call's seed), else the synchronous encode's result or error."""
        key = self._graph_key(ctx, x)  # (with the payload's shape: the graph makes the payload, whose shape it keeps)
        launched = graphs.launch(
            self, None if key is None else (key, tuple(payload.shape)), x,
            lambda: self._encode_deferred(x, payload.shape, payload.dtype, ctx), ctx.call_seed,
        )  # fmt: skip
        encoded, passed = launched.outputs

        def finish() -> Payload:
            try:
                ok = passed is None or bool(passed)  # the one read back
                result = own_copy(encoded, ctx.call_seed, x.device) if ok and launched.replayed else encoded
            finally:
                launched.release()
            if ok:
                return result
            if launched.replayed:
                launched.redone()
            return self._encode_now(x, Payload(shape=payload.shape, dtype=payload.dtype), ctx)

        return launched.freed_with(finish)

    def _encode_deferred(
        self, x: torch.Tensor, shape: torch.Size, dtype: torch.dtype, ctx: Context
    ) -> tuple[Payload, torch.Tensor | None]:
        """The encode into a new payload with its finiteness checks left on the device, and their joint answer
        (0-d bool; None where it made none): what :meth:`_checks_deferred` launches or replays."""
        payload = Payload(shape=shape, dtype=dtype)
        with deferring() as flags:
            self._encode_now(x, payload, ctx)
        if not flags:
            return payload, None
        return payload, flags[0] if len(flags) == 1 else torch.stack(flags).all()  # (one check: its own flag)

    replays_as_graph: ClassVar[bool] = False
    """Whether the encode with deferred checks (:attr:`defers_checks`) may be replayed as a CUDA graph
    (:meth:`_graph_key`). No class declares it yet. On the first H100 run of these graphs
    (reports/gpu/2026-11-26T1948Z.md) the replays of the rules that draw counter-hash keys (qsgd, dqsg, ndqsg, qcs,
    ecq, randk, terngrad) gave other payloads than the direct encode; signsgd, onebit and topk, which draw none,
    gave the same. The probable cause, reproduced on the CPU stand-in that poisons a capture's allocations at each
    replay (tests/compressors/_recorded_graph.py) but not yet confirmed on a GPU: the key slots were allocated
    during the capture, from the graph's private pool, which can give them the memory of a temporary freed earlier
    in the capture, so the replay's earlier kernels overwrote the keys filled in before it. They are now allocated
    before the capture (:class:`~gradstat.theory.kernels.counter_dither.KeySlots`); the stand-in fails the old
    allocation and passes the new.
    A class declares it once a GPU run shows its replays equal (tests/compressors/test_graphs.py, CUDA cases); until
    then ``GRADSTAT_CUDA_GRAPHS=all`` replays them (the microbench times them so on CUDA)."""

    def _graph_key(self, ctx: Context, x: torch.Tensor | None = None) -> Hashable | None:
        """What the queued encode's device part depends on besides its input and the call seed, for a CUDA graph to
        replay it (:mod:`gradstat.compressors.graphs`; the threshold sparsifiers' device part is
        :meth:`~gradstat.compressors.schemes.sparsifiers.threshold.ThresholdSparsifier._launch_queued`, and SIDCo, DGC
        and GMC give their own key): the settings, where the class declares :attr:`replays_as_graph` (or the graph
        policy is ``all``), no per-worker state is given and no draw comes from torch's generator (whose state a
        graph would freeze), with the worker's number (a host value an encode may branch on); else None, and its
        kernels launch one by one. ``x``: the flat input, for a key that
        depends on a host value the class keeps per input size (the fixed threshold's buffer size)."""
        declared = self.replays_as_graph or graphs.policy() == "all"
        if not declared or ctx.state is not None or getattr(self, "dither", "counter") == "torch":
            return None
        hyper = graphs.hyper_key(self)  # (and the worker: NDQSG's first p1 workers send DQSG's message)
        return None if hyper is None else (hyper, ctx.worker)

    def _encode_now(self, x: torch.Tensor, payload: Payload, ctx: Context) -> Payload:
        """The synchronous encode of the flat float ``x`` into ``payload``: the finiteness check where ``_encode``
        makes none, then ``_encode``."""
        if not self._validates_finite(x) and not finite(x):
            raise nonfinite_error(x, self.name)
        try:
            self._encode(x, payload, ctx)
        finally:
            forget_extremes()  # the check's extremes serve this encode only
        return payload

    def decode(self, payload: Payload, ctx: Context | None = None, side: torch.Tensor | None = None) -> torch.Tensor:
        """Reconstruct the tensor from ``payload`` (same shape and dtype as the encoded one).

        The payload is untrusted (another rank's bytes, :meth:`Payload.from_bytes`): a part that is missing, of
        another size or dtype than this compressor sends, drawn from another device's generator, or a
        reconstruction that would not be finite raises :class:`PayloadError` naming the part, never an
        IndexError or a silent NaN/Inf. The checks read shapes, dtypes and the small parts' extremes; the output
        is read once more only where its finiteness does not follow from those (:meth:`_proves_finite`)."""
        ctx = ctx or Context()
        if not isinstance(payload, Payload):
            raise TypeError(f"{self.name}: decode expects a Payload, got {type(payload).__name__}")
        if self.properties.needs_side and side is None:
            raise ValueError(f"{self.name}: decode needs side information (side=...)")
        flat_side = None if side is None else side.reshape(-1).float()
        payload.check_generator(payload.device, self.name)
        self._check_payload(payload)
        out = self._decode(payload, ctx, flat_side)
        if out.numel() != payload.numel:
            raise PayloadError(f"{self.name}: decoded {out.numel()} elements for a tensor of {payload.numel}")
        if not self._proves_finite(payload) and not all_finite(out):
            raise non_finite_reconstruction(self.name)
        result = out.reshape(payload.shape).to(payload.dtype)
        if payload.dtype == torch.float16 and not all_finite(result):  # float16 ends at 65504, the checks above not
            raise PayloadError(
                f"{self.name}: the reconstruction exceeds float16's range (65504) (a dithered reconstruction reaches "
                "beyond its scale); scale the gradient down (e.g. by a power of two) before compressing"
            )
        return result

    def min_numel(self) -> int:
        """The fewest elements a tensor must hold for this compressor to encode it: 1, or for a compressor with a
        target density ``ratio`` (delta) the smallest d with ``d * delta >= 1`` (what :func:`check_ratio` asks).
        A caller that sends smaller tensors sends them otherwise (the DDP hook: dense,
        :mod:`gradstat.compressors.schemes.dense`)."""
        ratio = getattr(self, "ratio", None)
        if not isinstance(ratio, float) or not 0.0 < ratio < 1.0:
            return 1
        d = max(1, math.ceil(1.0 / ratio))
        while d * ratio < 1.0:  # 1 / ratio rounded down by floating point
            d += 1
        return d

    def compresses(self, shape: tuple[int, ...]) -> bool:
        """Whether a DDP hook sends a tensor of ``shape`` with this compressor: here, whether it holds at least
        :meth:`min_numel` elements. A hook sends the others dense (:mod:`gradstat.compressors.schemes.dense`)."""
        return math.prod(shape) >= self.min_numel()

    @property
    def per_parameter(self) -> bool:
        """Whether a DDP hook compresses a bucket one parameter at a time (each in its own shape) even when it
        compresses bucket by bucket: a scheme whose method is per layer (PowerSGD's matrices). False here: the flat
        bucket is one tensor."""
        return False

    def new_state(self, like: torch.Tensor | None = None) -> Any:
        """Fresh per-worker state (None for stateless compressors)."""
        return None

    def round(
        self, grads: Sequence[torch.Tensor], ctx: Context | None = None, states: Sequence[Any] | None = None
    ) -> "RoundResult":
        """One synchronous round over P workers: each encodes its own gradient, the receiver decodes and
        averages. Schemes with side information or global state override this."""
        ctx = ctx or Context()
        states = list(states) if states is not None else [None] * len(grads)
        if len(states) != len(grads):
            raise ValueError(f"{len(grads)} gradients but {len(states)} states")
        payloads, decoded = [], []
        for w, (g, st) in enumerate(zip(grads, states, strict=True)):
            wctx = ctx.but(worker=w, state=st)
            p = self.encode(g, wctx)
            payloads.append(p)
            decoded.append(self.decode(p, wctx))
        mean = torch.stack([d.float() for d in decoded]).mean(0).to(grads[0].dtype)
        return RoundResult(mean=mean, decoded=decoded, payloads=payloads)

    def decode_all(self, payloads: Sequence[Payload], ctx: Context | None = None) -> list[torch.Tensor]:
        """Every worker's reconstruction from the payloads of one round, in worker order (``payloads[w]`` decoded
        with ``ctx.but(worker=w)``), as a receiver that holds them all computes it. Side-information schemes
        override it with their decoding order."""
        ctx = ctx or Context()
        return [self.decode(p, ctx.but(worker=w)) for w, p in enumerate(payloads)]

    def spec(self) -> str:
        """The spec string that rebuilds this compressor (see :mod:`gradstat.compressors.registry`)."""
        args = ",".join(f"{f.name}={getattr(self, f.name)}" for f in hyper_fields(self))
        return f"{self.name}:{args}" if args else self.name

    def __call__(self, g: torch.Tensor, ctx: Context | None = None) -> torch.Tensor:
        """encode then decode (no side information)."""
        ctx = ctx or Context()
        return self.decode(self.encode(g, ctx), ctx)

    def _check_payload(self, payload: Payload) -> None:  # noqa: B027  (a hook: nothing to check by default)
        """Refuse (:class:`PayloadError`) a payload whose parts this compressor's ``_decode`` cannot read safely:
        missing parts, sizes, dtypes. Reads shapes and dtypes only. Nothing here; each scheme states its own
        parts (:meth:`decode` has already refused a payload drawn from another device's generator)."""

    def _proves_finite(self, payload: Payload) -> bool:
        """Whether the reconstruction of ``payload`` is finite, shown from its parts without reading the output
        (e.g. a sparsifier's output is its finite values and zeros); False (here) makes :meth:`decode` read the
        output once to check it."""
        return False

    def _validates_finite(self, flat: torch.Tensor) -> bool:
        """Whether ``_encode`` proves the flat ``flat`` finite in a read it makes anyway (and raises
        :func:`nonfinite_error` otherwise), so that :meth:`encode` skips its own check pass. False here."""
        return False

    def _enqueue(self, x: torch.Tensor, payload: Payload, ctx: Context) -> Callable[[], Payload] | None:
        """Queue the encode of the flat float ``x`` without reading anything back, and return the function that
        reads back its results and finishes ``payload`` (:class:`~gradstat.compressors.pending.Pending`); None
        (here) where the compressor has no such form for this input, and :meth:`_encode` runs at once."""
        return None

    # -- to implement -----------------------------------------------------------------------------------------
    @abstractmethod
    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        """Fill ``payload`` from flat float ``g``."""

    @abstractmethod
    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        """Return the flat float reconstruction."""


@dataclass
class RoundResult:
    """Outcome of a round: the aggregate the model would apply, each worker's reconstruction and payload."""

    mean: torch.Tensor
    decoded: list[torch.Tensor]
    payloads: list[Payload]
    info: dict[str, Any] | None = None

    @property
    def bits(self) -> int:
        return sum(p.bits for p in self.payloads)


def hyper_fields(c: Compressor | type[Compressor]) -> tuple[Field[Any], ...]:
    """The hyper-parameters (dataclass fields) of a compressor class or instance; ``()`` if it is no dataclass.

    Subclasses are dataclasses by convention only, which the base class cannot state to a type checker;
    ``is_dataclass`` checks it at run time and narrows the type for ``fields``.
    """
    return fields(c) if is_dataclass(c) else ()


def encode_named(
    compressor: Compressor,
    grads: Mapping[str, torch.Tensor],
    ctx: Context | None = None,
    states: Mapping[str, Any] | None = None,
) -> dict[str, Payload]:
    """Per-layer compression of a dict of named tensors: each tensor is its own block (block = its position).

    Every layer's encode is queued before any is read back (:meth:`Compressor.enqueue`): on a device the kernels of
    the later layers are launched while the earlier ones run, and the host waits once per layer's read instead of
    between launches. Two layers given one state object are read back in turn (the second is queued after the
    first's payload: a state is updated when its payload is read). The payloads equal the ones of encoding each
    layer on its own, in order. The tensors must not change until this returns. Every layer's device buffers (and
    held graphs) stay alive until its payload is read, so the peak memory grows with the number of layers: split
    a very large model's dict into groups where that matters. An error is raised when its layer is queued or read
    (a later layer's queuing error before an earlier one's read error); the states of layers queued before it are
    not updated."""
    ctx = ctx or Context()
    pending: dict[str, Pending] = {}
    done: dict[str, Payload] = {}
    holding: dict[int, str] = {}  # id(state) -> the layer whose queued encode holds it
    for i, (name, g) in enumerate(grads.items()):
        state = (states or {}).get(name)
        if state is not None and id(state) in holding:
            earlier = holding.pop(id(state))
            done[earlier] = pending.pop(earlier).payload()
        pending[name] = compressor.enqueue(g, ctx.but(block=i, state=state))
        if state is not None:
            holding[id(state)] = name
    return {name: done[name] if name in done else pending[name].payload() for name in grads}


def decode_named(
    compressor: Compressor,
    payloads: Mapping[str, Payload],
    ctx: Context | None = None,
    states: Mapping[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`encode_named`."""
    ctx = ctx or Context()
    return {
        name: compressor.decode(p, ctx.but(block=i, state=(states or {}).get(name)))
        for i, (name, p) in enumerate(payloads.items())
    }


def own_copy(template: Payload, seed: int, device: torch.device) -> Payload:
    """A payload of its own from a graph's (:mod:`gradstat.compressors.graphs`): every tensor of its parts and
    diagnostics on the graph's ``device`` copied out of the graph's memory, which its next replay overwrites, and the
    ``seed`` part, the one host value a replay does not redo, set to this call's ``seed``. Host parts made while the
    graph was captured are constants, and shared."""
    out = Payload(shape=template.shape, dtype=template.dtype)
    for name, part in template.parts.items():
        if name == "seed":
            out.add_seed(seed)
        else:
            tensor = part.tensor.clone() if part.tensor.device == device else part.tensor
            out.parts[name] = dataclasses.replace(part, tensor=tensor)
    for key, value in template.info.items():
        out.info[key] = value.clone() if isinstance(value, torch.Tensor) and value.device == device else value
    return out


def check_gradient(g: torch.Tensor, who: str = "compressor", finite: bool = True) -> torch.Tensor:
    """Validate a gradient and return it flattened: a floating tensor with at least one element, all finite
    (``finite=False`` leaves the last to a caller that proves it in a read of its own).

    The finiteness check syncs once; it is the price of never returning a silent NaN.
    """
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"{who}: expected a torch.Tensor, got {type(g).__name__}")
    if not g.is_floating_point():
        raise TypeError(f"{who}: expected a floating-point tensor, got dtype {g.dtype}")
    if g.numel() == 0:
        raise ValueError(f"{who}: the gradient is empty (0 elements)")
    flat = g.reshape(-1)
    if finite and not all_finite(flat):  # one aminmax pass
        raise nonfinite_error(flat, who)
    return flat


def nonfinite_error(flat: torch.Tensor, who: str = "compressor") -> ValueError:
    """The error for a gradient holding NaN or Inf, with their count (a pass that runs on the error path only)."""
    bad = int(torch.count_nonzero(~torch.isfinite(flat)))
    return ValueError(f"{who}: the gradient holds {bad} NaN/Inf value(s) out of {flat.numel()}")


def non_finite_reconstruction(name: str) -> PayloadError:
    """The error :meth:`Compressor.decode` raises for a reconstruction that holds NaN/Inf (a scheme that checks its
    output's finiteness inside its ``_decode`` raises the same)."""
    return PayloadError(
        f"{name}: the reconstruction holds NaN/Inf (a part's values overflow float32's range once decoded); the "
        "payload is corrupt or its gradient was too close to float32's limit"
    )


def check_ratio(ratio: float, d: int | None = None, who: str = "ratio") -> float:
    """A target density delta in (0, 1); with ``d``, also require ``d * delta >= 1`` (at least one element)."""
    ratio = float(ratio)
    if not (0.0 < ratio < 1.0) or math.isnan(ratio):
        raise ValueError(f"{who} must lie in (0, 1), got {ratio}")
    if d is not None and d * ratio < 1.0:
        raise ValueError(
            f"{who}={ratio} keeps d*ratio = {d * ratio:.3g} < 1 element of a vector of length {d}; "
            f"need d >= 1/ratio = {math.ceil(1 / ratio)}"
        )
    return ratio


def check_int(who: str, value: object, minimum: int) -> int:
    """``value`` as an int >= minimum, else ValueError naming ``who``, the value and what is accepted."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{who} must be an integer >= {minimum}, got {value!r}")
    return value
