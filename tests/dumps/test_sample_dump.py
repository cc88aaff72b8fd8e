"""The sample dump shipped in data/samples stays readable and self-consistent (a format-compatibility guard: a
change of the format that breaks existing dumps fails here)."""

from __future__ import annotations

from pathlib import Path

import torch

from gradstat import compressors
from gradstat.analysis.dumps import open_dump

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "samples" / "logreg-topk-ef"


def test_sample_opens_and_every_checksum_matches():
    d = open_dump(SAMPLE)
    d.verify()
    assert (d.workload, d.steps, d.workers, d.numel) == ("logreg", [0, 1], 2, 7850)
    assert d.extras == ["residual", "compensated"]


def test_sample_extras_follow_plain_error_feedback_with_top_k_in_the_loop():
    """Recorded with topk:ratio=0.01 and plain error feedback over the whole flat gradient: h_0 = 0,
    z_t = g_t + h_t (compensated), h_{t+1} = z_t - TopK(z_t) (residual of the next step)."""
    d = open_dump(SAMPLE)
    topk = compressors.create(d.manifest["compression"]["compressor"])
    for w in range(d.workers):
        h0 = d.flat_extra("residual", 0, worker=w)
        z0 = d.flat_extra("compensated", 0, worker=w)
        assert torch.count_nonzero(h0) == 0
        assert torch.equal(z0, d.flat(0, worker=w))
        h1 = d.flat_extra("residual", 1, worker=w)
        assert torch.allclose(h1, z0 - topk(z0), atol=1e-7)
        assert torch.allclose(d.flat_extra("compensated", 1, worker=w), d.flat(1, worker=w) + h1, atol=1e-7)
