"""The parts of a threshold sparsifier's queued encode (on a device, nothing read back until the payload is sent).

:meth:`~gradstat.compressors.schemes.sparsifiers.threshold.ThresholdSparsifier._enqueue` runs a rule's threshold,
the selection and the tie-break's count on the device and reads them back in one copy
(:mod:`gradstat.compressors.pending`). This module holds what it is built from:

- :class:`Queued`: a rule's threshold as a 0-d device tensor, with the values it needs read back and the
  function that decides from them whether the queued result stands (SIDCo's
  :func:`gradstat.theory.pot.deferred_threshold`, DGC's sampled threshold);
- :func:`capacity`: the size of the selection's buffer (:func:`gradstat.theory.kernels.bounded.select_bounded`);
  a selection that outgrows it is made again by the synchronous encode, so the buffer bounds memory and time, never
  the result;
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels.peaks import Peaks

CAPACITY_FACTOR = 4.0
"""The buffer of a target-count rule's queued selection holds this many times its target k = ceil(delta d). SIDCo
adapts its stages until k_hat / k lies within 1 +- eps (eps = 0.2, Sec. 4); a fit still learning its stages can miss
by more, and a selection beyond the buffer costs the synchronous encode run again (the fit, the selection and their
reads back), not a wrong result."""


@dataclass(frozen=True)
class Queued:
    """A threshold computed on the device: ``threshold`` (0-d, the gradient's units), ``reads`` (1-D float64 on the
    device, possibly empty: what ``settle`` needs, read back with the selection's count in one copy) and
    ``settle(values, payload) -> bool``: True where the queued threshold does not stand for this input (the synchronous
    encode then runs instead); it may write diagnostics to the payload's ``info``."""

    threshold: torch.Tensor
    reads: torch.Tensor
    settle: Callable[[list[float], Payload], bool]
    peaks: Peaks | None = None
    """The sub-block maxima of the gradient where the rule's own read stored them
    (:mod:`gradstat.theory.kernels.peaks`): the selection then skips the sub-blocks below the threshold."""


def nothing_to_settle(values: list[float], payload: Payload) -> bool:
    """``settle`` of a threshold whose queued value always stands (no values read)."""
    return False


def capacity(d: int, k: int) -> int:
    """The queued selection's buffer for a target of ``k`` of ``d`` elements: ``ceil(CAPACITY_FACTOR k)``, at
    least 1 and at most ``d``."""
    return max(1, min(d, math.ceil(CAPACITY_FACTOR * k)))
