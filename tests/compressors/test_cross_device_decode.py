"""A payload decodes to the same tensor wherever it is decoded: every registered compressor's payload, encoded on one
device and sent as bytes (``to_bytes`` / ``from_bytes``), decodes on another exactly as on its own.

On a CPU the two "devices" are this process (one torch thread) and a fresh process with another thread count (every
random draw regenerated there from the seed alone; the parallel loops split differently). With CUDA present the two
are the CPU and the GPU, both ways (marked ``cuda``); there a reconstruction may differ from the CPU's by rounding in
the transforms' summation order (cuBLAS against the CPU's BLAS), so the GPU comparison allows a relative 1e-5 of the
largest magnitude, far below the differences of a regenerated index or sign (order 1 in those units).

A payload drawn from torch's per-device generator (``dither=torch``) records its device type (``device`` part) and is
refused, with a PayloadError naming that part, on another device type.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.payload import GENERATOR_DEVICES, Payload

ROOT = Path(__file__).resolve().parents[2]
OTHER_THREADS = 2
DEVICE_BOUND = ["dqsg:dither=torch", "qcs:dither=torch", "ndqsg:dither=torch"]  # decoders redraw torch's numbers
HALF_DITHERED = ["ecq:dither=torch", "qsgd:dither=torch"]  # torch's draws at encode only: decoded anywhere
TORCH_DRAWS = DEVICE_BOUND + HALF_DITHERED
SPECS = compressors.names() + TORCH_DRAWS
SHAPES = [(40_000,), (200, 200)]  # above torch's parallel grain (32768 elements): the thread count matters


def _laplace(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(shape, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()


def _cases(device: torch.device | str) -> list[dict]:
    """Every spec's payloads (1-D and 2-D; workers 0 and 1, NDQSG's nested worker being 1) encoded on ``device``:
    the spec, shape, worker, bytes, side information and this device's own decode."""
    out = []
    for spec in SPECS:
        c = compressors.create(spec)
        for shape in SHAPES:
            g = _laplace(shape, 3).to(device)
            for worker in (0, 1):
                ctx = Context(seed=3, worker=worker, state=c.new_state(g))
                payload = c.encode(g, ctx)
                side = g if c.properties.needs_side else None
                decoded = c.decode(payload, ctx.but(state=None), side=side)
                out.append(
                    {
                        "spec": spec,
                        "shape": list(shape),
                        "worker": worker,
                        "bytes": payload.to_bytes().cpu(),
                        "side": None if side is None else side.cpu(),
                        "decoded": decoded.cpu(),
                    }
                )
    return out


def decode_case(case: dict, device: torch.device | str) -> torch.Tensor:
    """The case's bytes read and decoded on ``device`` (a fresh compressor, as a receiving rank builds it)."""
    c = compressors.create(case["spec"])
    payload = Payload.from_bytes(case["bytes"].to(device), torch.Size(case["shape"]), torch.float32)
    side = None if case["side"] is None else case["side"].to(device)
    return c.decode(payload, Context(seed=3, worker=case["worker"]), side=side)


_CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(int(sys.argv[3]))
    from tests.compressors.test_cross_device_decode import decode_case
    cases = torch.load(sys.argv[1], weights_only=True)
    torch.save([decode_case(c, "cpu") for c in cases], sys.argv[2])
    """
)


def _decoded_in_another_process(cases: list[dict], tmp_path: Path) -> list[torch.Tensor]:
    sent, received = tmp_path / "cases.pt", tmp_path / "decoded.pt"
    torch.save([{k: v for k, v in c.items() if k != "decoded"} for c in cases], sent)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, str(sent), str(received), str(OTHER_THREADS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(received, weights_only=True)


def _label(case: dict) -> str:
    return f"{case['spec']} {tuple(case['shape'])} worker {case['worker']}"


def test_every_compressor_decodes_the_same_in_a_process_with_another_thread_count(tmp_path):
    assert torch.get_num_threads() != OTHER_THREADS
    cases = _cases("cpu")
    there = _decoded_in_another_process(cases, tmp_path)
    differ = [_label(c) for c, got in zip(cases, there, strict=True) if not torch.equal(got, c["decoded"])]
    assert differ == [], f"decoded differently with {OTHER_THREADS} threads: {differ}"
    assert {c["spec"] for c in cases} == set(SPECS)


def test_decoding_from_bytes_here_equals_the_encoder_s_own_decode():
    cases = _cases("cpu")
    differ = [_label(c) for c in cases if not torch.equal(decode_case(c, "cpu"), c["decoded"])]
    assert differ == []


@pytest.mark.parametrize("spec", DEVICE_BOUND)
def test_a_payload_of_torch_s_generator_records_its_device_and_counts_it(spec):
    c, g = compressors.create(spec), _laplace((5000,), 1)
    payload = c.encode(g, Context(seed=1, worker=1))
    assert payload.parts["device"].kind == "seed" and payload.parts["device"].width == 8
    assert GENERATOR_DEVICES[int(payload["device"][0])] == "cpu"
    plain = compressors.create(spec.replace("torch", "counter")).encode(g, Context(seed=1, worker=1))
    assert "device" not in plain.parts and payload.bits == plain.bits + 8


@pytest.mark.parametrize("spec", DEVICE_BOUND)
def test_a_payload_of_another_device_s_generator_is_refused(spec):
    c, g = compressors.create(spec), _laplace((5000,), 1)
    payload = c.encode(g, Context(seed=1, worker=1))
    payload.parts["device"] = payload.parts["device"].__class__(
        torch.tensor([GENERATOR_DEVICES.index("cuda")], dtype=torch.uint8), 8, "seed"
    )  # as a GPU would have sent it
    back = Payload.from_bytes(payload.to_bytes(), payload.shape, payload.dtype)
    with pytest.raises(PayloadError, match="torch's cuda generator .* dither=counter") as err:
        c.decode(back, Context(seed=1, worker=1), side=g)
    assert err.value.part == "device"


def test_counter_draws_send_no_generator_record():
    for spec in compressors.names() + HALF_DITHERED:
        c, g = compressors.create(spec), _laplace((5000,), 1)
        assert "device" not in c.encode(g, Context(seed=1, worker=1, state=c.new_state(g))).parts, spec


# -- CPU <-> CUDA ---------------------------------------------------------------------------------------------------
def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = float(b.abs().max()) if b.numel() else 0.0
    return bool(((a.cpu() - b.cpu()).abs() <= 1e-5 * max(scale, 1e-30)).all())


@pytest.mark.cuda
@pytest.mark.parametrize("source,target", [("cpu", "cuda"), ("cuda", "cpu")])
def test_every_compressor_decodes_the_same_on_cpu_and_cuda(source, target):
    cases = _cases(source)
    differ, refused = [], []
    for case in cases:
        try:
            got = decode_case(case, target)
        except PayloadError as exc:
            refused.append((_label(case), exc.part))
            continue
        if not _close(got, case["decoded"]):
            differ.append(f"{_label(case)}: max |diff| {float((got.cpu() - case['decoded']).abs().max()):.3g}")
    assert differ == []
    assert {label.split(" ")[0] for label, _ in refused} == set(DEVICE_BOUND)
    assert {part for _, part in refused} == {"device"}
