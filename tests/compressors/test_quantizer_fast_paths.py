"""The in-place quantizer paths (scratch buffers, no padded copy, integer clamp) give the same payloads and the same
reconstructions, bit for bit, as their plain reference forms (the same dithers: counter or torch's draws), at every size
(ragged last bucket included), scale and dtype."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels import counter_dither, counter_native, policy, triton_dither, triton_runtime

QUANTIZERS = [
    ScaledQuantizer(levels=4, bucket=512, norm="l2", subtract=False),  # QSGD
    ScaledQuantizer(levels=1, bucket=0, norm="linf", subtract=False),  # TernGrad
    ScaledQuantizer(levels=2, bucket=0, norm="linf", subtract=True),  # DQSG
    ScaledQuantizer(levels=3, bucket=100, norm="linf", subtract=True),
    ScaledQuantizer(levels=127, bucket=7, norm="l2", subtract=True),  # codes at the edge of int8
    ScaledQuantizer(levels=200, bucket=33, norm="linf", subtract=False),  # int16 codes
    ScaledQuantizer(levels=1, bucket=64, norm="linf", subtract=True, onebit=True),  # 1-bit QCS
]
QUANTIZERS += [replace(q, dither="torch") for q in QUANTIZERS]  # the default counter dither, then torch's draws
SIZES = [1, 7, 512, 513, 4099, 70_001]
SCALES = [1.0, 1e-30, 1e30, 1e-40, 3e37]


def _gradient(d: int, seed: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(d, generator=gen, dtype=torch.float64) * torch.rand(d, generator=gen, dtype=torch.float64) ** 6
    g[:: max(1, d // 5)] = 0.0  # some exact zeros (and an all-zero bucket for small buckets)
    return (g * scale).to(dtype)


def _payload(d: int) -> Payload:
    return Payload(shape=torch.Size([d]), dtype=torch.float32)


@pytest.mark.parametrize(
    "q", QUANTIZERS, ids=lambda q: f"L{q.levels}-b{q.bucket}-{q.norm}-s{q.subtract:d}-1b{q.onebit:d}-{q.dither}"
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_encode_and_decode_equal_the_plain_reference_bit_for_bit(q, dtype):
    for d in SIZES:
        for i, scale in enumerate(SCALES):
            if dtype == torch.float32 and scale == 1e-40 and d > 513:
                continue  # float32 subnormals: covered at the small sizes
            x = _gradient(d, 10 * d + i, scale, dtype)
            fast, plain = _payload(d), _payload(d)
            try:
                q.encode_reference(x, plain, seed=d + i)
            except ValueError as exc:  # a scale float32 cannot carry: the fast path refuses it too
                with pytest.raises(ValueError, match=str(exc)[:40]):
                    q.encode(x, fast, seed=d + i)
                continue
            q.encode(x, fast, seed=d + i)
            for name in ("codes", "scales"):
                assert fast[name].dtype == plain[name].dtype, (name, d, scale)
                assert torch.equal(fast[name], plain[name]), (name, d, scale)
            out, ref = q.decode(fast, d, seed=d + i), q.decode_reference(plain, d, seed=d + i)
            assert out.dtype == ref.dtype and torch.equal(out, ref), (d, scale)


def test_the_scratch_buffers_do_not_leak_into_results():
    q = QUANTIZERS[2]
    first = _payload(4099)
    q.encode(_gradient(4099, 1, 1.0, torch.float32), first, seed=1)
    kept = first["codes"].clone()
    out = q.decode(first, 4099, seed=1)
    out_kept = out.clone()
    q.encode(_gradient(4099, 2, 5.0, torch.float32), _payload(4099), seed=2)  # reuses the scratch buffers
    q.decode(first, 4099, seed=3)
    assert torch.equal(first["codes"], kept) and torch.equal(out, out_kept)


@pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")
@pytest.mark.parametrize(
    "q",
    [q for q in QUANTIZERS if q.dither == "counter" or not q.subtract],
    ids=lambda q: f"L{q.levels}-b{q.bucket}-{q.norm}-s{q.subtract:d}-1b{q.onebit:d}-{q.dither}",
)
def test_the_one_pass_decode_on_cuda_equals_the_plain_reference(q, device, monkeypatch):
    """The decode CUDA takes (the Triton kernel's one pass over the codes as they are, every bucket's scale): on a
    CUDA device as it runs there, on a CPU through Triton's interpreter in place of the C loop; the plain
    reference's values on the same device, bit for bit, at every size and scale."""
    if device.type == "cpu":
        monkeypatch.setattr(counter_native, "reconstructs", lambda codes, scale: False)
        monkeypatch.setattr(counter_dither, "triton_reconstructs", lambda codes, scale: True)
        monkeypatch.setattr(counter_dither, "triton_for", lambda name, out, blocks, rows, rest=(): name == (
            "reconstruct_rows_into") and triton_dither.applies(name, out, blocks, rows, rest))  # fmt: skip
    launches = []
    run = triton_dither.run
    monkeypatch.setattr(triton_dither, "run", lambda *args: launches.append(args[0]) or run(*args))
    # (no compiled kernel in between: on a CPU the Triton form or nothing; CUDA never compiles these)
    with policy.forced("never" if device.type == "cpu" else "auto"):
        for d in (1, 513, 4099, 70_001):
            for i, scale in enumerate((1.0, 1e-30, 3e37)):
                x = _gradient(d, 10 * d + i, scale, torch.float32).to(device)
                payload = _payload(d)
                q.encode_reference(x, payload, seed=d + i)
                out, ref = q.decode(payload, d, seed=d + i), q.decode_reference(payload, d, seed=d + i)
                assert out.device == x.device and out.dtype == ref.dtype and torch.equal(out, ref), (d, scale)
    assert launches and set(launches) == {"reconstruct_rows_into"}
