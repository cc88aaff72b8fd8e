"""torch's own DDP hooks as baselines, measured like ours: plain all-reduce, fp16/bf16 casts, PowerSGD.

:func:`baseline_hook` wraps a torch hook so that ``state.metrics`` counts the bytes it hands to its collectives
(fp16/bf16: 2 bytes per element; PowerSGD: the element count its state reports after compression, 4 bytes each)
and the time spent in the hook's body (torch's callbacks run inside its futures and are not timed separately).

torch's ``batched_powerSGD_hook`` is broken in torch 2.13.0, so PowerSGD is ``powerSGD_hook``; it calls
``.wait()`` inside its ``then()`` callbacks, which can deadlock on gloo with several buckets: use it with one
bucket (``bucket_cap_mb`` large enough) on gloo. Compression starts at iteration ``start_iter`` (torch requires
>= 2 with error feedback or warm start, because DDP rebuilds its buckets after the first iteration). Its callbacks
also synchronise CUDA whenever CUDA is available, with the gradients' own device: CPU gradients on a machine with a
visible GPU fail there ("Expected a cuda device"), so the hook refuses them at its first bucket, with what to do
(:func:`check_powersgd_device`).
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from gradstat.compressors.ddp.state import StepMetrics

BASELINES = ("fp16", "bf16", "torch-powersgd")


@dataclass
class BaselineState:
    """A torch hook's own state plus our per-step metrics."""

    name: str
    inner_state: Any
    inner_hook: Callable[[Any, dist.GradBucket], torch.futures.Future]
    metrics: StepMetrics = field(default_factory=StepMetrics)
    compressed_numel: int = 0

    def take_metrics(self) -> StepMetrics:
        out, self.metrics = self.metrics, StepMetrics()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ValueError(f"baseline state was saved for {state.get('name')!r}, this hook is {self.name!r}")


def baseline_hook(
    name: str, process_group: dist.ProcessGroup | None = None, rank: int = 1, start_iter: int = 2
) -> tuple[BaselineState, Callable[[BaselineState, dist.GradBucket], torch.futures.Future]]:
    """``fp16`` | ``bf16`` | ``torch-powersgd`` (rank ``rank``, error feedback and warm start on)."""
    if name in ("fp16", "bf16"):
        inner = default_hooks.fp16_compress_hook if name == "fp16" else default_hooks.bf16_compress_hook
        return BaselineState(name, process_group, inner), measured_hook
    if name == "torch-powersgd":
        ps = powerSGD_hook.PowerSGDState(
            process_group=process_group,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start_iter,
            use_error_feedback=True,
            warm_start=True,
        )
        return BaselineState(name, ps, powerSGD_hook.powerSGD_hook), measured_hook
    raise ValueError(f"unknown baseline hook {name!r}; known: {', '.join(BASELINES)}")


def check_powersgd_device(device: torch.device) -> None:
    """Refuse what torch's PowerSGD hook cannot run: gradients off CUDA while CUDA is available (its callbacks call
    ``torch.cuda.synchronize`` on the gradients' device whenever a GPU is visible, and fail inside the backward
    pass)."""
    if device.type != "cuda" and torch.cuda.is_available():
        raise RuntimeError(
            f"torch-powersgd: torch's PowerSGD hook synchronises CUDA whenever a GPU is visible and fails on "
            f"{device.type} gradients; train on cuda, or hide the GPUs (CUDA_VISIBLE_DEVICES=) for {device.type}"
        )


def measured_hook(state: BaselineState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Call the wrapped torch hook and count its bytes and body time into ``state.metrics``."""
    start = time.perf_counter()
    numel = bucket.buffer().numel()
    inner = state.inner_state
    before = 0
    if isinstance(inner, powerSGD_hook.PowerSGDState):
        check_powersgd_device(bucket.buffer().device)
        before = inner.total_numel_after_compression
    fut = state.inner_hook(inner, bucket)
    if isinstance(inner, powerSGD_hook.PowerSGDState):
        after = inner.total_numel_after_compression - before
        nbytes = 4 * (after if after > 0 else numel)
    else:
        nbytes = 2 * numel
    state.metrics.bits += 8 * nbytes
    state.metrics.wire_bytes += nbytes
    state.metrics.sent_bytes += nbytes
    state.metrics.buckets += 1
    state.metrics.hook_seconds += time.perf_counter() - start
    return fut
