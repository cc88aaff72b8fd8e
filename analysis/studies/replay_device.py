"""Where a replay runs: on the device the dump was recorded on, unless the caller names one (design, device rules).

A replay reproduces what the recorded run did only on the device type the run computed on: the compressors' random
draws are device-independent, but reductions (norms, sums, thresholds) round differently on CPU and CUDA, so the
error-feedback residual and every value derived from it can drift from the recorded ones in the last bits. The
recorders write the device type into the manifest's ``metadata`` (key
:data:`~gradstat.analysis.dumps.format.RECORDED_DEVICE_KEY`); dumps that do not say (imported, or recorded before
the key existed) replay where ``auto`` points (CUDA when present).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from gradstat.analysis.dumps.format import RECORDED_DEVICE_KEY
from gradstat.analysis.measure.selection import resolve_device
from gradstat.analysis.studies.replay import ReplayWarning


def recorded_device(dump: Any) -> str | None:
    """The device type the dump says its gradients were computed on, None when it does not say.

    ValueError naming the dump when the recorded value is not a device type torch knows.
    """
    value = dump.manifest.get("metadata", {}).get(RECORDED_DEVICE_KEY)
    if value is None:
        return None
    try:
        return torch.device(value).type
    except (RuntimeError, TypeError):
        raise ValueError(
            f"{dump.path}: metadata {RECORDED_DEVICE_KEY!r} must name a device type such as 'cpu' or 'cuda', "
            f"got {value!r}"
        ) from None


def replay_device(dump: Any, requested: str | None) -> torch.device:
    """The device to replay ``dump`` on: ``requested`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``) when given, else the
    recorded device type, else ``auto``. Warns (:class:`ReplayWarning`) when the replay runs on another device type
    than the recording, where it cannot be bit-exact."""
    recorded = recorded_device(dump)
    if requested is not None:
        device = resolve_device(requested)
        if recorded is not None and device.type != recorded:
            _warn(recorded, device, f"as --device {requested} asks")
        return device
    if recorded is None:
        return resolve_device("auto")
    if recorded == "cpu" or (recorded == "cuda" and torch.cuda.is_available()):
        return torch.device(recorded)
    device = resolve_device("auto")
    _warn(recorded, device, f"as gradstat has no {recorded} device here")
    return device


def _warn(recorded: str, device: torch.device, why: str) -> None:
    warnings.warn(
        ReplayWarning(
            f"the dump was recorded on {recorded} and is replayed on {device.type}, {why}: reductions round "
            f"differently on another device, so values and residuals may differ from the recorded ones in the "
            f"last bits (not bit-exact); --device {recorded} replays where it was recorded"
        ),
        stacklevel=3,
    )
