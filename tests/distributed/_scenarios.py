"""What the ranks do in the distributed tests (functions run by ``_ranks.run_ranks``; plain values returned)."""

from __future__ import annotations

import io
import math
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradstat.analysis.training.workloads import get_workload
from gradstat.compressors.ddp import make_hook
from gradstat.compressors.ddp.exchange import SIZE_EXCHANGE_BYTES
from gradstat.compressors.schemes.sparsifiers.topk import TopK

WORKLOAD = "fc300"


class _Refusing(TopK):
    """Top-k that declares it compresses any tensor (``min_numel`` 1), so a too-small ratio refuses in encode."""

    def min_numel(self) -> int:
        return 1


def _setup(spec, feedback="ef", seed=0, bucket_caps=None, granularity="bucket", keep=True, exchange="gather"):
    wl = get_workload(WORKLOAD)
    model = wl.model(seed)
    ddp = DDP(model, **({} if bucket_caps is None else {"bucket_cap_mb_list": bucket_caps}))
    state, hook = make_hook(
        spec, feedback, model=model, seed=seed, granularity=granularity, keep_payloads=keep, exchange=exchange
    )
    ddp.register_comm_hook(state, hook)
    return wl, model, ddp, state, wl.optimizer(model)


def _batches(wl, rank, world, seed=1):
    local = wl.batch_size // world
    for x, y in wl.batches(seed):
        yield x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]


def _eval_loss(wl, model) -> float:
    x, y = wl.dataset()
    with torch.no_grad():
        return float(wl.loss(model(x[:512]), y[:512]))


def _step(wl, ddp, opt, x, y) -> float:
    opt.zero_grad(set_to_none=True)
    loss = wl.loss(ddp(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def train_each(rank: int, world: int, specs: list[str], feedback: str, iterations: int) -> dict:
    """Train fc300 with each compressor; per spec: eval loss before/after, per-step metrics and the byte count
    expected from the received payloads (``ceil(bits/8)`` plus header per block; padded to the longest rank plus
    the length exchange for the collective)."""
    out = {}
    for spec in specs:
        wl, model, ddp, state, opt = _setup(spec, feedback)
        batches = _batches(wl, rank, world)
        before = _eval_loss(wl, model)
        steps = []
        for _ in range(iterations):
            state.taps.last.clear()
            _step(wl, ddp, opt, *next(batches))
            m = state.take_metrics()
            wire = {r: 0 for r in range(world)}
            for (r, _block), (payload, _decoded) in state.taps.last.items():
                wire[r] += payload.header_bits // 8 + math.ceil(payload.bits / 8)
            bits_mine = sum(p.bits for (r, _b), (p, _d) in state.taps.last.items() if r == rank)
            steps.append(
                {
                    "bits": m.bits,
                    "wire_bytes": m.wire_bytes,
                    "sent_bytes": m.sent_bytes,
                    "expected_bits": bits_mine,
                    "expected_wire": wire[rank],
                    "expected_sent": max(wire.values()) + SIZE_EXCHANGE_BYTES * m.buckets,
                    "buckets": m.buckets,
                    "blocks": len(m.blocks),
                }
            )
        out[spec] = {"before": before, "after": _eval_loss(wl, model), "steps": steps}
    return out


def failures(rank: int, world: int) -> dict:
    """A rank with NaN gradients, a compressor refusing its input on every rank, all-zero buckets (an empty
    SIDCo selection): what each rank sees."""
    out: dict = {}
    wl, model, ddp, state, opt = _setup("topk:ratio=0.01")
    batches = _batches(wl, rank, world)
    x, y = next(batches)
    clean = x
    if rank == 1:
        x = x.clone()
        x[0, 0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    try:
        _step(wl, ddp, opt, x, y)
        out["nan"] = None
    except Exception as exc:  # what the training loop of each rank sees
        out["nan"] = f"{type(exc).__name__}: {exc}"
    # the bad batch is skipped: the same DDP model and hook train on the next one
    out["skipped_unchanged"] = all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))
    out["memory_untouched"] = all(w.feedback.residual is None for b in state.memory.buckets.values() for w in b.blocks)
    try:
        out["next_loss"] = _step(wl, ddp, opt, clean, y)
        out["next_moved"] = not all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))
        out["next_residual_finite"] = all(
            bool(torch.isfinite(w.feedback.residual).all()) for b in state.memory.buckets.values() for w in b.blocks
        )
    except Exception as exc:
        out["next_loss"] = f"{type(exc).__name__}: {exc}"
    # keeps < 1 of 266,610 elements, and (unlike TopK, whose hook would send such a bucket dense) claims it can
    # compress it: refused in encode
    wl, model, ddp, state, opt = _setup(_Refusing(ratio=0.000001))
    try:
        _step(wl, ddp, opt, x if rank == 0 else x.nan_to_num(0.0), y)
        out["refused"] = None
    except Exception as exc:
        out["refused"] = f"{type(exc).__name__}: {exc}"
    wl, model, ddp, state, opt = _setup("sidco:ratio=0.01", keep=True)
    params = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad(set_to_none=True)
    (0.0 * wl.loss(ddp(x.nan_to_num(0.0)), y)).backward()  # every gradient is exactly zero
    out["zero_grads_nonzero"] = sum(int(p.grad.count_nonzero()) for p in model.parameters())
    out["zero_bits"] = state.take_metrics().bits
    out["zero_indices"] = [int(p["indices"].numel()) for (r, b), (p, d) in state.taps.last.items()]
    opt.step()
    out["params_unchanged"] = all(torch.equal(a, b.detach()) for a, b in zip(params, model.parameters(), strict=True))
    # the group is still usable afterwards: two steps with each exchange give the same model
    finals = {}
    for exchange in ("gather", "allreduce"):
        wl, model, ddp, state, opt = _setup("qsgd", exchange=exchange)
        batches = _batches(wl, rank, world)
        out["after"] = [_step(wl, ddp, opt, *next(batches)) for _ in range(2)][-1]
        finals[exchange] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out[f"{exchange}_sent"] = state.take_metrics().sent_bytes
    out["exchanges_agree"] = torch.equal(finals["gather"], finals["allreduce"])
    return out


def checkpoint(
    rank: int,
    world: int,
    spec: str,
    feedback: str,
    iterations: int,
    split: int,
    caps: list[int] | None,
    granularity: str = "bucket",
    exchange: str = "gather",
) -> dict:
    """Straight training vs. training interrupted at ``split``: hook state, model and optimizer saved
    (``torch.save``), everything rebuilt in fresh objects, state loaded (``weights_only=True``), training resumed.
    Returns both final parameter vectors, the bucket signatures seen and the hook's rebuild count."""

    def run(stop: int | None, resume: bytes | None):
        wl, model, ddp, state, opt = _setup(
            spec, feedback, bucket_caps=caps, granularity=granularity, exchange=exchange
        )
        if resume is not None:
            saved = torch.load(io.BytesIO(resume), weights_only=True)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            state.load_state_dict(saved["hook"])
        batches = _batches(wl, rank, world)
        first = 0 if resume is None else split
        for _ in range(first):
            next(batches)
        sigs = []
        for _ in range(first, stop if stop is not None else iterations):
            _step(wl, ddp, opt, *next(batches))
            sigs.append(
                sorted(list(k) for k, b in state.memory.buckets.items() if b.last_step == state.memory.step - 1)
            )
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, buf)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        return flat, buf.getvalue(), sigs, state.memory.rebuilds, len(state.memory.buckets)

    straight, _, sigs, rebuilds, buckets = run(None, None)
    _, saved, _, _, _ = run(split, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, _, _, _, _ = run(None, saved)
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return {
        "straight": straight,
        "resumed": resumed,
        "sigs": sigs,
        "rebuilds": rebuilds,
        "buckets": buckets,
        "warned": warned,
    }


def record_and_keep(
    rank: int, world: int, runs: list[tuple[str, str, str]], iterations: int, caps: list[int] | None = None
) -> dict:
    """For each (spec, feedback, dump): train with a layer-wise hook (DDP's per-bucket caps ``caps``) and per-rank
    recording of every step (residual included); return what the receivers decoded of every rank's message per
    (step, rank, block): bits, tensor."""
    from gradstat.analysis.training.recorder import RankRecorder

    out = {}
    for spec, feedback, dump in runs:
        wl, model, ddp, state, opt = _setup(spec, feedback, granularity="layer", seed=5, bucket_caps=caps)
        rec = RankRecorder.create(dump, model, rank, world, every=1, residual=True, workload=wl.name)
        rec.attach(state, opt)
        batches = _batches(wl, rank, world)
        kept = {}
        for step in range(iterations):
            state.taps.last.clear()
            _step(wl, ddp, opt, *next(batches))
            for (r, block), (payload, decoded) in state.taps.last.items():
                kept[f"{step}/{r}/{block}"] = (payload.bits, decoded)
        out[spec] = kept
    dist.barrier()
    return out


def rebuild(rank: int, world: int, spec: str, caps: list[int], iterations: int) -> dict:
    """Train with small buckets; per step, the signatures of the buckets used and each parameter's residual as
    the state holds it after the step and as the hook shows it to observers before the next step."""
    wl, model, ddp, state, opt = _setup(spec, "ef", bucket_caps=caps)
    seen: dict = {}

    def observe(step, view):
        for pos, r in zip(view.params, view.residuals, strict=True):
            seen[(step, pos)] = None if r is None else r.detach().clone()

    state.taps.observers.append(observe)
    batches = _batches(wl, rank, world)
    used, after = [], []
    for _ in range(iterations):
        _step(wl, ddp, opt, *next(batches))
        now = [b for b in state.memory.buckets.values() if b.last_step == state.memory.step - 1]
        used.append(sorted(list(b.signature) for b in now))
        after.append({pos: b.residual_of(j).clone() for b in now for j, pos in enumerate(b.signature)})
    before = [{pos: seen[(t, pos)] for pos in range(6)} for t in range(iterations)]
    return {
        "used": used,
        "after": after,
        "before": before,
        "rebuilds": state.memory.rebuilds,
        "kept": len(state.memory.buckets),
    }


def several(rank: int, world: int, calls: dict[str, tuple[str, dict]]) -> dict:
    """Run several scenarios of this module in one process group (one start of the ranks for a test module):
    ``calls[name] = (function name, keyword arguments)``; returns ``{name: {"ok": result}}`` or
    ``{name: {"error": traceback}}`` per scenario, so that one failing scenario fails only its own tests."""
    import traceback

    out: dict = {}
    for name, (fn, kwargs) in calls.items():
        try:
            out[name] = {"ok": globals()[fn](rank, world, **kwargs)}
        except Exception:
            out[name] = {"error": traceback.format_exc()}
        dist.barrier()
    return out


class TinyTensors(torch.nn.Module):
    """Tensors of every awkward size: a 0-d scale, biases of 4 and 64, a 64-element norm, a 16 x 64 and a 64 x 64
    weight (parameter sizes, in the model's order: 1, 1024, 64, 64, 64, 4096, 64, 256, 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.mid = torch.nn.Linear(64, 64)
        self.out = torch.nn.Linear(64, 4)
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.inp(x)))
        return self.scale * self.out(torch.tanh(self.mid(h)))


def tiny_tensors(
    rank: int,
    world: int,
    specs: list[str],
    feedback: str,
    iterations: int,
    granularity: str = "layer",
    dense_below: int = 0,
    dtype: str = "float32",
) -> dict:
    """Train :class:`TinyTensors` (a linear teacher's targets) under a hook per spec. Per spec: the losses, each
    block's (numel, bits sent) by this rank, the blocks counted dense, and for every block that went dense this
    rank's gradient before compression next to what rank 0 decoded of this rank's message (the last step)."""
    out = {}
    for spec in specs:
        torch.manual_seed(0)
        model = TinyTensors().to(getattr(torch, dtype))
        ddp = DDP(model)
        state, hook = make_hook(
            spec, feedback, model=model, seed=3, granularity=granularity, dense_below=dense_below, keep_payloads=True
        )
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        seen: dict = {}

        def observe(step, view, seen=seen):
            for pos, g in zip(view.params, view.grads, strict=True):
                seen[pos] = g.detach().clone()

        state.taps.observers.append(observe)
        gen = torch.Generator().manual_seed(11)
        teacher = torch.randn(16, 4, generator=gen)
        losses, dense = [], []
        for _ in range(iterations):
            x = torch.randn(32, 16, generator=gen)[rank * 16 : (rank + 1) * 16].to(getattr(torch, dtype))
            state.taps.last.clear()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(ddp(x), x @ teacher.to(x.dtype))
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            dense.append(state.take_metrics().dense_blocks)
        sizes = {pos: p.numel() for pos, p in enumerate(model.parameters())}
        shapes = {pos: tuple(p.shape) for pos, p in enumerate(model.parameters())}
        sent = {b: (p.numel, p.bits) for (r, b), (p, _d) in state.taps.last.items() if r == rank}
        decoded = {b: d for (r, b), (_p, d) in state.taps.last.items() if r == rank}
        out[spec] = {
            "losses": losses,
            "dense": dense,
            "sizes": sizes,
            "shapes": shapes,
            "sent": sent,
            "local": {b: seen[b] for b in seen if granularity == "layer"},
            "decoded": decoded,
            "params_finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
            "final": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        }
    return out


def powersgd_against_torch(rank: int, world: int, workload: str, runs: list[str], iterations: int) -> dict:
    """Train ``workload`` on one DDP bucket (torch's PowerSGD hook can deadlock on gloo with several) from the same
    initial model and batches with each of ``runs``: ``torch-powersgd`` (torch's hook: rank 1, error feedback, warm
    start, compression from iteration 2), ``allreduce``, or a gradstat spec with error feedback. Per run: the
    training losses and the evaluation loss after training."""
    from unittest import mock

    from gradstat.compressors.ddp import baseline_hook

    wl = get_workload(workload)
    out = {}
    for run in runs:
        model = wl.model(0)
        ddp = DDP(model, bucket_cap_mb=1000)
        if run == "torch-powersgd":
            ddp.register_comm_hook(*baseline_hook(run))
        elif run != "allreduce":
            ddp.register_comm_hook(*make_hook(run, "ef", model=model, seed=1))
        opt = wl.optimizer(model)
        batches = _batches(wl, rank, world)
        # a CPU rank: torch's hook synchronises CUDA whenever a GPU is visible (and fails on CPU gradients), so the
        # GPUs are hidden from it, as CUDA_VISIBLE_DEVICES= would (gradstat's baseline refuses the visible case)
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            losses = [_step(wl, ddp, opt, *next(batches)) for _ in range(iterations)]
        out[run] = {"losses": losses, "eval": _eval_loss(wl, model)}
    return out


def resume_then_fail(rank: int, world: int, spec: str, caps: list[int], split: int) -> dict:
    """Train ``split`` steps bucket-wise, save, resume in fresh objects and feed rank 1 a NaN on the first resumed
    step (compressed over the saved buckets): what each rank sees of that step, and whether the next batch trains."""
    wl, model, ddp, state, opt = _setup(spec, "ef", bucket_caps=caps)
    batches = _batches(wl, rank, world)
    for _ in range(split):
        _step(wl, ddp, opt, *next(batches))
    saved = {"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
    wl, model, ddp, state, opt = _setup(spec, "ef", bucket_caps=caps)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["hook"])
    x, y = next(batches)
    bad = x.clone()
    if rank == 1:
        bad[0, 0] = float("nan")
    out: dict = {}
    try:
        _step(wl, ddp, opt, bad, y)
        out["nan"] = None
    except Exception as exc:
        out["nan"] = f"{type(exc).__name__}: {exc}"
    out["next_loss"] = _step(wl, ddp, opt, x, y)
    return out


def resume_deep(rank: int, world: int, spec: str, granularity: str, cap: float, iterations: int, split: int) -> dict:
    """Six 256 x 256 linear layers with ``bucket_cap_mb=cap``: DDP's initial single bucket, rebuilt into several.
    Straight training vs. training interrupted at ``split`` and resumed in fresh objects (state through
    ``torch.save``/``weights_only``): both final parameter vectors, the buckets used per step, the warnings."""

    def run(stop: int, resume: bytes | None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
        ddp = DDP(model, bucket_cap_mb=cap)
        state, hook = make_hook(spec, "ef", model=model, seed=2, granularity=granularity)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if resume is not None:
            saved = torch.load(io.BytesIO(resume), weights_only=True)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            state.load_state_dict(saved["hook"])
        gen = torch.Generator().manual_seed(3)
        batches = [torch.randn(16, 256, generator=gen) for _ in range(iterations)]
        used = []
        for t in range(0 if resume is None else split, stop):
            x = batches[t][rank * 8 : (rank + 1) * 8]
            opt.zero_grad(set_to_none=True)
            ddp(x).square().mean().backward()
            opt.step()
            used.append(
                sorted(list(k) for k, b in state.memory.buckets.items() if b.last_step == state.memory.step - 1)
            )
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, buf)
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), buf.getvalue(), used

    straight, _, used = run(iterations, None)
    _, saved, _ = run(split, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed, _, used_resumed = run(iterations, saved)
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return {"straight": straight, "resumed": resumed, "used": used, "used_resumed": used_resumed, "warned": warned}
