"""Threshold sparsification: send the values and indices of the coordinates with |g_i| >= eta.

This module is the one home of the step every magnitude sparsifier shares (Top-k, fixed threshold, DGC, GMC's
approximate top-K, RedSync, GaussianKSGD, SIDCo):

- :func:`select_at_least` -- the indices of ``|g| >= eta`` (zeros never selected: sending a zero is waste; the
  primitive itself lives in :mod:`gradstat.theory.kernels.primitives`);
- :func:`add_sparse` / :func:`decode_sparse` -- the wire format: ``indices`` (bit-packed at ``ceil(log2 d)`` bits or
  int32) and ``values`` (float32), so ``bits = k_hat * (ceil(log2 d) + 32)``;
- :class:`ThresholdSparsifier` -- a compressor that only has to say how it finds its threshold (``_threshold``).

SIDCo (Abdelmoniem et al.), Algorithm 1 line 8: ``C(g) = g[abs(g) >= eta_M]``.
A threshold selection keeps the k_hat largest magnitudes, so ``||C(g) - g||^2 <= (1 - k_hat/d) ||g||^2`` holds for
every g (the top m of d squared values carry at least m/d of the sum); that is the contraction these declare.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from gradstat.compressors import graphs
from gradstat.compressors.base import Compressor, Properties, nonfinite_error
from gradstat.compressors.context import Context
from gradstat.compressors.registry import register
from gradstat.compressors.schemes.sparsifiers.queued import Queued, capacity, nothing_to_settle
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.floats import widened
from gradstat.compressors.wire.payload import Payload, index_width
from gradstat.theory import scalars as S
from gradstat.theory.kernels.bounded import Bounded, select_bounded
from gradstat.theory.kernels.primitives import (
    abs_scratch,
    all_finite,
    count_at_least,
    count_at_least_deferred,
    count_at_smallest,
    count_triton,
    finish_triton,
    max_abs,
    normalise_by_pow2,
    pow2_exponent,
    scale_by_pow2,
    scan_at_least,
    select_at_least,
    triton_exact,
)
from gradstat.theory.kernels.stage_stats import summary

THRESHOLD_CONTRACTION = "1 - k_hat/d"
"""Contraction constant of any sparsifier that keeps the k_hat largest magnitudes (k_hat = nonzeros sent)."""


def threshold_properties(source: str, randomized: bool = False, bound: str | None = None) -> Properties:
    """What every sparsifier that keeps its k_hat largest magnitudes declares: biased, with the contraction
    :data:`THRESHOLD_CONTRACTION`; ``source`` the paper and section it implements."""
    return Properties(
        kind="sparsifier",
        unbiased=False,
        randomized=randomized,
        contraction=THRESHOLD_CONTRACTION,
        bound=bound,
        source=source,
    )


def search_threshold(
    abs_g: torch.Tensor,
    k: int,
    eta: torch.Tensor,
    band: tuple[float, float],
    max_iter: int,
    low: torch.Tensor | None = None,
    high: torch.Tensor | None = None,
    expand: float = 2.0,
) -> tuple[torch.Tensor, int]:
    """Move a threshold until the count it selects lies in ``[band[0] k, band[1] k]``, within ``max_iter`` counts.

    Too many selected -> the threshold rises (``low = eta``); too few -> it falls (``high = eta``). The next
    threshold is the midpoint of ``[low, high]`` once both are known, else ``eta * expand`` or ``eta / expand``.
    This is the search the RedSync and GaussianKSGD baselines describe, with the direction always towards the
    band (a search that can move away from it, as in the SIDCo authors' RedSync baseline, is a bug) and a bounded
    number of steps (constant or all-zero input cannot loop forever).

    Parameters
    ----------
    abs_g : (d,) magnitudes |g|.
    k : target count (>= 1).
    eta : starting threshold (0-d tensor, units of g).
    band : accepted count range as multiples of k, ``band[0] <= 1 <= band[1]``.
    max_iter : at most this many counts (each one a pass over ``abs_g`` and a host sync).
    low, high : thresholds already known to select too many / too few (None: unknown).
    expand : factor of a step while only one side is known (> 1).

    Returns
    -------
    (eta, steps): the last threshold tried (0-d tensor) and how many counts were made.
    """
    steps = 0
    for step in range(1, max_iter + 1):
        steps = step
        n = count_at_least(abs_g, eta)
        if band[0] * k <= n <= band[1] * k or not bool(eta > 0):
            break
        if n > band[1] * k:  # too many: rise, to the midpoint once the other side is known
            low = eta
            eta = (low + high) / 2 if high is not None else low * expand
        else:  # too few: fall
            high = eta
            eta = (low + high) / 2 if low is not None else high / expand
    return eta, steps


def search_threshold_deferred(
    abs_g: torch.Tensor,
    k: int,
    eta: torch.Tensor,
    band: tuple[float, float],
    max_iter: int,
    low: torch.Tensor | None = None,
    high: torch.Tensor | None = None,
    expand: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`search_threshold` with every decision on the device: the same thresholds, counts and steps, nothing
    read back (a queued encode's search). Where the synchronous search stops (the count in the band, or a threshold
    that is not positive), this one keeps its state through the remaining counts instead of breaking out, so it
    always makes ``max_iter`` counts (passes over ``abs_g``): the price of not waiting for the host at every step.
    Returns ``(eta, steps)``, both 0-d tensors on ``abs_g``'s device (``steps`` int64: the synchronous search's
    count of counts)."""
    device = abs_g.device
    lo_k, hi_k = band[0] * k, band[1] * k
    known_low = torch.full((), low is not None, dtype=torch.bool, device=device)
    known_high = torch.full((), high is not None, dtype=torch.bool, device=device)
    low = eta if low is None else low  # (a placeholder where unknown: never read then)
    high = eta if high is None else high
    factor = torch.full((), expand, dtype=eta.dtype, device=device)  # (divided by a tensor: exact on every device)
    done = torch.zeros((), dtype=torch.bool, device=device)
    steps = torch.zeros((), dtype=torch.int64, device=device)
    for step in range(1, max_iter + 1):
        n = count_at_least_deferred(abs_g, eta)
        stop = ((n >= lo_k) & (n <= hi_k)) | ~(eta > 0)
        steps = torch.where(done, steps, step)
        move = ~(done | stop)
        done = done | stop
        too_many = n > hi_k  # rise (low = eta), to the midpoint once the other side is known; else fall (high = eta)
        rise = torch.where(known_high, (eta + high) / 2, eta * expand)
        fall = torch.where(known_low, (low + eta) / 2, eta / factor)
        low = torch.where(move & too_many, eta, low)
        high = torch.where(move & ~too_many, eta, high)
        known_low = known_low | (move & too_many)
        known_high = known_high | (move & ~too_many)
        eta = torch.where(move, torch.where(too_many, rise, fall), eta)
    return eta, steps


def queued_search(
    g: torch.Tensor,
    k: int,
    start: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]],
    band: tuple[float, float],
    max_iter: int,
    needs_signed: bool,
) -> tuple[torch.Tensor, Queued, int]:
    """A search rule's queued threshold (:meth:`ThresholdSparsifier._queued`) for a target of ``k``: ``|g|``
    normalised by the power of two at its largest, as the synchronous encode normalises it, then
    ``start(g_normalised, magnitudes) -> (eta_0, {"low": .., "high": ..})`` (the rule's first threshold and the
    bounds it knows; ``g_normalised`` is ``g`` itself unless ``needs_signed``), :func:`search_threshold_deferred`, and
    the threshold scaled back to ``g``'s units; the search's steps are read back with the selection
    (``payload.info["search_steps"]``). The selection's buffer holds the band's top end at least (a search that runs
    out of counts may select more: the synchronous encode then runs)."""
    d = g.numel()
    top = max_abs(g)
    e = pow2_exponent(top)
    mags = normalise_by_pow2(abs_scratch(g), e)
    g_n = scale_by_pow2(g, -e) if needs_signed else g
    eta, bounds = start(g_n, mags)
    eta, steps = search_threshold_deferred(mags, k, eta, band, max_iter, bounds.get("low"), bounds.get("high"))

    def settle(values: list[float], payload: Payload) -> bool:
        payload.info["search_steps"] = int(values[0])
        return False

    queued = Queued(scale_by_pow2(eta, e), steps.double().reshape(1), settle)
    return top, queued, max(capacity(d, k), min(d, math.ceil(band[1] * k)))


def add_sparse(
    payload: Payload,
    g: torch.Tensor,
    indices: torch.Tensor,
    packed: bool = True,
    exact: bool = True,
    values: torch.Tensor | None = None,
) -> None:
    """Put ``indices`` (at ``ceil(log2 d)`` bits if ``packed``, else 32) and ``g[indices]`` into ``payload``, the
    values in the gradient's wire dtype (:meth:`Payload.add_floats`: bf16 and fp16 at 16 bits, float32 otherwise).
    ``exact``: ``g`` is the gradient itself (its elements travel exactly); False for values computed from it.
    ``values``: the values at ``indices`` where the caller has them already, checked for the wire
    (:func:`~gradstat.compressors.wire.floats.wire_flags`)."""
    payload.add("indices", indices, index_width(g.numel(), packed), "index")
    sent = g.index_select(0, indices) if values is None else values
    payload.add_floats("values", sent, "value", "sparsifier", "selected value", exact=exact, checked=values is not None)


def decode_sparse(payload: Payload) -> torch.Tensor:
    """The flat float32 vector with ``payload['values']`` at ``payload['indices']`` and zeros elsewhere."""
    values = payload["values"]
    values = widened(values)
    out = torch.zeros(payload.numel, dtype=values.dtype, device=values.device)
    return out.index_put_((payload["indices"],), values)


def check_sparse(payload: Payload) -> None:
    """Refuse (PayloadError) a sparse payload :func:`decode_sparse` cannot read: as many floating values as integer
    indices, at most one per element (shapes and dtypes only; the indices' range is checked where bytes are read,
    :meth:`Payload.from_bytes`)."""
    indices = payload.require("indices", integer=True, at_most=payload.numel)
    if indices.dtype not in (torch.int32, torch.int64):  # (bool and uint8 would index as a mask)
        raise PayloadError(f"has dtype {indices.dtype}; indices are int32 or int64", "indices")
    payload.require("values", numel=indices.numel(), integer=False)


def sparse_finite(payload: Payload) -> bool:
    """Whether :func:`decode_sparse`'s output is finite: it is its values and zeros (one read of the k values)."""
    return all_finite(payload["values"])


class SparseMessage(Compressor):
    """A compressor whose message is :func:`add_sparse`'s (indices and their values): decoded by
    :func:`decode_sparse`, its received parts checked by :func:`check_sparse`, finite where its values are."""

    def _decode(self, payload: Payload, ctx: Context, side: torch.Tensor | None) -> torch.Tensor:
        return decode_sparse(payload)

    def _check_payload(self, payload: Payload) -> None:
        check_sparse(payload)

    def _proves_finite(self, payload: Payload) -> bool:
        return sparse_finite(payload)


def break_ties(abs_g: torch.Tensor, indices: torch.Tensor, k: int, n_low: int | None = None) -> torch.Tensor:
    """The selection of a target-count sparsifier with exact ties resolved towards ``k`` (as the exact top-k does).

    A threshold rule cannot tell equal magnitudes apart: on a vector of a handful of distinct values (or a constant
    one) ``|g| >= eta`` keeps every coordinate tied at the smallest selected magnitude, or, when the threshold lands
    just above the largest magnitude, none. Where ties decide, keep what the exact top-k keeps, ties taken in index
    order: when the selection holds more than ``k`` coordinates, several of them tied at its smallest magnitude and
    at most ``k`` above it, the ties fill up to ``k``; when it is empty and more than ``k`` coordinates are tied at
    the largest magnitude, those fill up to ``k``. Only exact ties are trimmed or added, so a selection on
    continuous data (no ties) is never changed. ``indices`` are sorted (``select_at_least``); so is the result.
    ``abs_g`` may also be the signed vector: only magnitudes are compared. ``n_low``: how many selected magnitudes
    equal the smallest selected one, where the caller has counted it already (the bounded selection's tally,
    :attr:`~gradstat.theory.kernels.bounded.Bounded.tally`)."""
    n = indices.numel()
    if n > k:
        n_low = count_at_smallest(abs_g, indices) if n_low is None else n_low
        if n_low > 1 and n - n_low <= k:
            selected = abs_g.index_select(0, indices).abs_()
            at_low = selected == selected.min()
            keep = torch.cat([indices[~at_low], indices[at_low][: k - (n - n_low)]])
            return torch.sort(keep).values
        return indices
    if n == 0:
        top = max_abs(abs_g)
        if bool(top > 0):
            at_top = torch.nonzero((abs_g == top) | (abs_g == -top)).reshape(-1)
            if at_top.numel() > k:
                return at_top[:k]
    return indices


@dataclass
class Narrowed:
    """A threshold together with the increasing ``indices`` of a superset of the coordinates it selects and their
    ``magnitudes`` (what a multi-stage fit gathered on its way, :func:`gradstat.theory.pot.multistage_threshold`
    with ``narrow``)."""

    threshold: torch.Tensor
    indices: torch.Tensor
    magnitudes: torch.Tensor


class ThresholdSparsifier(SparseMessage):
    """A sparsifier defined by how it computes its threshold from ``|g|``.

    Subclasses implement ``_threshold(g, abs_g, ctx, payload) -> 0-d tensor`` on the gradient normalised by the
    power of two at its largest magnitude (so ``max abs_g`` lies in [0.5, 1); the threshold is returned in those
    units and scaled back for ``payload.info``; ``g`` is normalised too only when ``needs_signed`` is set; a rule
    whose threshold is given in the gradient's units sets ``absolute_threshold``). They may write diagnostics to
    ``payload.info`` (never sent) and may override ``_refine`` to post-process the selection (DGC's
    exact fallback). The threshold itself is not sent: the receiver only needs indices and values.
    """

    packed: bool

    absolute_threshold: bool = False
    """Whether ``_threshold`` returns eta in the gradient's own units (a fixed threshold) rather than normalised."""
    needs_signed: bool = False
    """Whether ``_threshold`` reads the signed ``g`` (then it receives the power-of-two normalised copy)."""

    reads_summary: bool = False
    """Whether the rule's signed path starts from the fused summary of ``|g|``
    (:func:`gradstat.theory.kernels.stage_stats.summary`): where that kernel runs compiled, its read is also the
    gradient's finiteness check and gives the largest magnitude, so the encode reads ``g`` once less."""

    def _validates_finite(self, flat: torch.Tensor) -> bool:
        return self.reads_summary and summary.fast_for(flat, True)

    def _summary(self, g: torch.Tensor) -> torch.Tensor:
        """The fused summary of ``|g|`` the rule reads first (:attr:`reads_summary`); with its minima here."""
        return summary(g, True)

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        # Thresholds are found on |g| 2^-e with 2^e the power of two at max |g| (exact): every threshold rule sees
        # the same numbers for g and for g scaled by any power of two, so the selection is exactly equivariant,
        # and fits never meet values near float32's overflow or denormal range.
        stats = self._summary(g) if self._validates_finite(g) else None
        top = max_abs(g) if stats is None else stats[1]  # the summary is the check: NaN and Inf reach its maximum
        largest = float(top)  # one host sync for the finiteness and all-zero decisions
        if not math.isfinite(largest):
            raise nonfinite_error(g, self.name)
        if not largest > 0:  # an all-zero gradient: no rule selects a zero, so nothing is sent
            self._send(payload, g, torch.zeros(0, dtype=torch.int64, device=g.device), None)
            return
        found = self._signed_threshold(g, ctx, payload, stats)
        signed = found is not None
        narrowed = found if isinstance(found, Narrowed) else None
        if found is not None:  # eta in g's units, |g| read inside fused kernels: no magnitude vector is formed
            eta = found.threshold if isinstance(found, Narrowed) else found
            mags = g
        else:
            e = pow2_exponent(top)
            mags = normalise_by_pow2(abs_scratch(g), e)
            g_n = scale_by_pow2(g, -e) if self.needs_signed else g
            eta = self._threshold(g_n, mags, ctx, payload)
            if self.absolute_threshold:
                eta = scale_by_pow2(eta, -e)
        ratio = getattr(self, "ratio", None)
        if narrowed is None:
            indices = select_at_least(mags, eta, signed=signed, density=ratio)
        else:  # the rule narrowed the search to a superset of the selection
            indices = narrowed.indices.index_select(0, select_at_least(narrowed.magnitudes, eta))
        indices = self._refine(mags, indices, payload, ctx)
        if ratio is not None:
            indices = break_ties(mags, indices, math.ceil(ratio * mags.numel()))
        self._send(payload, g, indices, eta if signed else scale_by_pow2(eta, e))

    def _enqueue(self, x: torch.Tensor, payload: Payload, ctx: Context) -> Callable[[], Payload] | None:
        """The queued encode (:mod:`gradstat.compressors.pending`) where the rule has one (:meth:`_queued`) and the
        scalars live on the device (:func:`gradstat.theory.scalars.on_host` is false: a GPU, or a CPU under
        ``GRADSTAT_COMPILE=never``): the rule's threshold, the selection into a buffer of fixed size
        (:func:`~gradstat.theory.kernels.bounded.select_bounded`) and the tie-break's count run on the device, and
        the returned function reads back, in one copy, the largest magnitude (the finiteness and all-zero checks),
        the count, the tie count and the rule's own values. Where any of them says the queued result does not
        stand (a non-finite or all-zero gradient, a selection larger than the buffer, a rule's own case), it runs
        the synchronous encode instead. The result is the synchronous one's, with one difference of rounding: where
        SIDCo's stages read the signed gradient, the synchronous last stage sums the exceedances it gathered and
        the queued one the whole vector masked, so their thresholds agree to the last bits (tested to 1e-12) and
        the selections exactly unless an element lies within those bits of the threshold."""
        if S.on_host(x):
            return None
        launched = graphs.launch(self, self._graph_key(ctx, x), x, lambda: self._launch_queued(x, ctx), ctx.call_seed)
        if launched.outputs is None:
            launched.release()
            return None
        queued, room, selected, reads = launched.outputs

        def finish() -> Payload:
            try:
                values = reads.tolist()  # the one host read: the wire needs the count anyway
                largest, count, n_low = values[0], int(values[1]), int(values[2])
                redo = not (math.isfinite(largest) and largest > 0) or count > room
                redo = redo or queued.settle(values[3:], payload)
                # a graph's outputs are overwritten by its next replay: the payload keeps copies
                indices = selected.indices[:count]
                threshold = queued.threshold
                if launched.replayed and not redo:
                    indices, threshold = indices.clone(), threshold.clone()
            finally:
                launched.release()
            if redo:
                if launched.replayed:
                    launched.redone()
                return self._encode_now(x, Payload(shape=payload.shape, dtype=payload.dtype), ctx)
            refined = self._refine(x, indices, payload, ctx)
            ratio = getattr(self, "ratio", None)
            if ratio is not None:
                refined = break_ties(x, refined, math.ceil(ratio * x.numel()), n_low if refined is indices else None)
            self._send(payload, x, refined, threshold)
            return payload

        return launched.freed_with(finish)

    def _launch_queued(self, x: torch.Tensor, ctx: Context) -> tuple[Queued, int, Bounded, torch.Tensor] | None:
        """The device part of the queued encode (what a CUDA graph replays, :mod:`gradstat.compressors.graphs`):
        the rule's threshold (:meth:`_queued`), the selection into its buffer, the tie-break's count, and the one
        vector read back, ``[max |x|, count, ties, *rule's reads]``; None where the rule has no queued form."""
        found = self._queued(x, ctx)
        if found is None:
            return None
        top, queued, room = found
        # (no tie-break without a target density: nothing to count)
        ties = getattr(self, "ratio", None) is not None
        peaks = queued.peaks if top is not None else None  # (the largest magnitude needs every element read)
        selected = select_bounded(x, queued.threshold, True, room, extremes=top is None, ties=ties, peaks=peaks)
        # the tally is [max |x|, count, ties]; where the rule had the largest magnitude, its own read's
        head = [selected.tally] if top is None else [top.double().reshape(1), selected.tally[1:]]
        reads = torch.cat([*head, queued.reads])
        return queued, room, selected, reads

    def _queued(self, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor | None, Queued, int] | None:
        """Where the rule has a queued form for ``g`` (on a device): queue it, and return the largest magnitude
        (0-d, from a read the rule makes anyway where it can; None: the selection's count finds it on its read), the
        :class:`Queued` threshold in ``g``'s units and
        the selection's buffer size (:func:`~gradstat.compressors.schemes.sparsifiers.queued.capacity`). None
        (here), before queuing anything: the rule has none, and the synchronous encode runs."""
        return None

    def _send(self, payload: Payload, g: torch.Tensor, indices: torch.Tensor, eta: torch.Tensor | None) -> None:
        """Put the selection into ``payload``, with the threshold (in g's units; None: an all-zero gradient, +inf)
        and k_hat as diagnostics."""
        if eta is None:
            eta = torch.full((), math.inf, dtype=g.dtype, device=g.device)
        payload.info["threshold"] = eta
        payload.info["k_hat"] = indices.numel()
        add_sparse(payload, g, indices, self.packed)

    @abstractmethod
    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        """The threshold eta (0-d tensor on ``g``'s device) for the flat gradient ``g`` with ``abs_g = |g|``."""

    def _signed_threshold(
        self, g: torch.Tensor, ctx: Context, payload: Payload, stats: torch.Tensor | None = None
    ) -> torch.Tensor | Narrowed | None:
        """The threshold in ``g``'s own units computed from ``g`` itself, reading ``|g|`` inside fused kernels
        (:mod:`gradstat.theory.kernels.fused`) so that neither ``|g|`` nor its normalised copy is ever formed; None (the
        default) where the rule has no such path or the kernels would not run compiled. Such a threshold must be
        ``2^e`` times the one ``_threshold`` finds on the normalised magnitudes, bit for bit where the statistics
        are float64 sums (power-of-two scaling is exact there) and to rounding where they take float32
        logarithms (SIDCo's gamma stage), so both paths select the same coordinates -- except on a vector spanning
        more than float32's exponent range: the normalisation flushes ``|g| < 2^(e - 149)`` to zero and so leaves
        those out of the fit, while this path keeps them. ``_refine`` then receives the signed ``g`` in place of
        ``abs_g``. ``stats``: the fused summary of ``|g|`` already read (see :attr:`reads_summary`), else None. A
        rule that has gathered a superset of the selection on the way returns it with the threshold
        (:class:`Narrowed`): the selection then reads only those elements."""
        return None

    def _refine(self, abs_g: torch.Tensor, indices: torch.Tensor, payload: Payload, ctx: Context) -> torch.Tensor:
        """Post-process the selected indices (identity here)."""
        return indices


ROOM_MIN = 1024
"""The smallest buffer the fixed threshold's queued selection keeps (elements)."""
ROOM_FACTOR = 1.5
"""The fixed threshold's buffer holds this many times the most elements its rule selected at that size, rounded up
to a power of two (so that a count that drifts step to step keeps one buffer size, one graph)."""


@functools.lru_cache(maxsize=64)
def narrowed(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype`` on the host (a CPU conversion, made once per value and dtype): beyond the
    dtype's range it rounds to inf (a threshold that selects nothing), where ``torch.full`` would refuse it."""
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))


def room_for(d: int, selected: int) -> int:
    """The buffer for a fixed-threshold selection of ``d`` elements that selected ``selected`` (``ROOM_FACTOR`` times
    it rounded up to a power of two, at least :data:`ROOM_MIN`, at most ``d``)."""
    wanted = max(ROOM_MIN, math.ceil(ROOM_FACTOR * selected))
    return min(d, 1 << (wanted - 1).bit_length())


@register("threshold")
@dataclass
class FixedThreshold(ThresholdSparsifier):
    """Fixed threshold: send every coordinate with ``|g_i| >= eta`` (Strom 2015; SIDCo (Abdelmoniem et al.),
    Sec. 1 "threshold-based methods"). eta: the threshold, > 0, in the gradient's units. packed: bit-packed indices.

    The rule has no target count to size a buffer by, so its first encode of each size runs the exact selection
    (two reads of the gradient with the count read back between them), and each encode remembers the most elements
    selected at that size: from the second on, the encode is queued as the other threshold rules' are (one device
    part, read back once; a CUDA graph's replay where the input repeats, under ``GRADSTAT_CUDA_GRAPHS=all`` until a
    GPU run shows it equal), into a buffer of :func:`room_for` that many; a selection that overflows it is encoded
    exactly again, and the buffer grows."""

    eta: float = 1e-3
    packed: bool = True

    properties = threshold_properties(
        "SIDCo (Abdelmoniem et al.) Sec. 1 (threshold-based sparsification)",
        bound=None,
    )

    def __post_init__(self) -> None:
        if not (float(self.eta) > 0.0) or self.eta == float("inf"):
            raise ValueError(f"threshold eta must be a finite number > 0, got {self.eta}")
        self._rooms: dict[int, int] = {}
        """Per input size, the queued selection's buffer (:func:`room_for` of the most selected so far)."""

    def _send(self, payload: Payload, g: torch.Tensor, indices: torch.Tensor, eta: torch.Tensor | None) -> None:
        super()._send(payload, g, indices, eta)
        d = g.numel()
        self._rooms[d] = max(self._rooms.get(d, 0), room_for(d, indices.numel()))

    def _queued(self, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor | None, Queued, int] | None:
        """Where a buffer size is known for ``g``'s size: ``eta`` on the device, the largest magnitude left to the
        selection's count (one read of ``g`` for both), nothing of the rule's own to read back."""
        room = self._rooms.get(g.numel())
        if room is None:
            return None
        eta = torch.full((), self._narrowed_eta(g.dtype), dtype=g.dtype, device=g.device)
        return None, Queued(eta, torch.empty(0, dtype=torch.float64, device=g.device), nothing_to_settle), room

    def _graph_key(self, ctx: Context, x: torch.Tensor | None = None) -> Hashable | None:
        """The settings and the buffer size for ``x``'s size (a new size is a new graph); only under the graph policy
        ``all`` until a GPU run shows the replays equal to the direct encode (as SIDCo's, DGC's and GMC's were):
        under ``auto`` the queued form launches its kernels one by one."""
        if graphs.policy() != "all":
            return None
        room = None if x is None else self._rooms.get(x.numel())
        hyper = graphs.hyper_key(self)
        return None if room is None or hyper is None else (hyper, room)

    def _narrowed_eta(self, dtype: torch.dtype) -> float:
        """eta narrowed to ``dtype`` (:func:`narrowed`)."""
        return narrowed(float(self.eta), dtype)

    absolute_threshold = True

    def _threshold(self, g: torch.Tensor, abs_g: torch.Tensor, ctx: Context, payload: Payload) -> torch.Tensor:
        # filled on the device (a tensor copied from the host would wait for a GPU's queue)
        return torch.full((), self._narrowed_eta(abs_g.dtype), dtype=abs_g.dtype, device=abs_g.device)

    def _validates_finite(self, flat: torch.Tensor) -> bool:
        return True  # the selection's read gives max |g| (NaN and Inf reach it): see _encode

    def _enqueue(self, x: torch.Tensor, payload: Payload, ctx: Context) -> Callable[[], Payload] | None:
        """Queued where the exact selection runs by Triton (:func:`~gradstat.theory.kernels.primitives.triton_exact`:
        CUDA): the counts per block and the largest magnitude are launched here, nothing read back; the returned
        function reads the count and the maximum in one copy (the wire needs the count: no buffer can be sized
        without a target), then writes the selection. The synchronous encode's payload and errors, in the same two
        reads of ``x`` (:func:`~gradstat.theory.kernels.triton_select.select_exact`, split at its read back). Once a
        buffer size is known for ``x``'s size, the threshold rules' queued form instead (:meth:`_queued`)."""
        if x.numel() in self._rooms:
            queued = super()._enqueue(x, payload, ctx)
            if queued is not None:
                return queued
        if not triton_exact(x):
            return None
        eta = self._threshold(x, x, ctx, payload)
        counted = count_triton(x, eta, True, True)
        if counted is None:  # (the Triton form failed: reported once, and the synchronous encode runs)
            return None

        def finish() -> Payload:
            found = finish_triton(counted)
            if found is None:
                return self._encode_now(x, Payload(shape=payload.shape, dtype=payload.dtype), ctx)
            indices, _, top = found
            assert top is not None  # (counted with the block maxima)
            if not math.isfinite(top):
                raise nonfinite_error(x, self.name)
            self._send(payload, x, indices, eta if top > 0 else None)
            return payload

        return finish

    def _encode(self, g: torch.Tensor, payload: Payload, ctx: Context) -> None:
        # eta is in g's units: compare |g| with it directly (exact); one read selects and proves g finite
        eta = self._threshold(g, g, ctx, payload)
        indices, top = scan_at_least(g, eta, signed=True)
        if not math.isfinite(top):
            raise nonfinite_error(g, self.name)
        self._send(payload, g, indices, eta if top > 0 else None)
