"""Payload comparison shared by the tests of the queued and replayed encodes."""

from __future__ import annotations

import torch

from gradstat.compressors.wire.payload import Payload


def assert_same_payload(a: Payload, b: Payload, threshold_rtol: float = 0.0) -> None:
    """Parts, bits and diagnostics equal, bit for bit; the ``threshold`` diagnostic within ``threshold_rtol``
    relative (a threshold summed in another order)."""
    assert sorted(a.parts) == sorted(b.parts)
    for name in a.parts:
        assert torch.equal(a[name], b[name]), name
    assert a.bits == b.bits
    assert a.info.keys() == b.info.keys()
    for key, value in a.info.items():
        other = b.info[key]
        if key == "threshold" and threshold_rtol > 0:
            assert isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor)
            torch.testing.assert_close(value, other, rtol=threshold_rtol, atol=0.0)
        elif isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor)
            assert torch.equal(value, other), key
        else:
            assert value == other, key
