"""Collectives of the compression hooks: padded all-gather of variable-length byte messages, and all-reduce.

gloo rejects an all-gather of tensors of different lengths (and a mismatch can abort one rank while another reads
garbage), so a variable-length exchange is two collectives: every rank first all-gathers its message length and a
status flag (two int64 values), then every rank pads its message to the longest one and all-gathers that. The
status flag lets a rank that cannot compress (NaN gradient, a compressor that refuses its input) tell every other
rank: it sends its error message instead of a payload, and every rank raises the same error. Nobody waits forever
for a rank that gave up.

Only the length exchange is waited for inside the hook (the padded buffers cannot be allocated before); the
payload all-gather is returned as a future, to be combined in a ``then()`` callback that never waits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

OK, FAILED = 0, 1
SIZE_EXCHANGE_BYTES = 16
"""Bytes each rank sends in the length exchange: its message length and its status flag, two int64."""


@dataclass
class Gathered:
    """The launched padded all-gather: ``buffers[r][:lengths[r]]`` is rank r's message once ``future`` is done.

    sent_bytes : bytes this rank handed to the collectives (its padded message plus the length exchange).
    """

    future: torch.futures.Future
    buffers: list[torch.Tensor]
    lengths: list[int]
    sent_bytes: int

    def message(self, rank: int) -> torch.Tensor:
        return self.buffers[rank][: self.lengths[rank]]


class RemoteError(ValueError):
    """A rank could not compress its gradient; raised on every rank with every failing rank's message."""


def gather_messages(message: torch.Tensor, failed: bool, group: dist.ProcessGroup | None) -> Gathered:
    """Exchange lengths and status (waited for), then launch the padded all-gather of ``message`` (uint8, 1-D).

    When any rank reports failure, the gather is completed here and :class:`RemoteError` is raised on every rank,
    naming each failing rank and its message (the failing rank's ``message`` is its UTF-8 error text)."""
    world = dist.get_world_size(group)
    device = message.device
    mine = torch.tensor([message.numel(), FAILED if failed else OK], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(sizes, mine, group=group, async_op=True).wait()  # in the hook body, never in a callback
    table = torch.stack(sizes).cpu()
    lengths, status = table[:, 0].tolist(), table[:, 1].tolist()
    longest = max(max(lengths), 1)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: message.numel()] = message
    buffers = [torch.empty_like(padded) for _ in range(world)]
    work = dist.all_gather(buffers, padded, group=group, async_op=True)
    gathered = Gathered(work.get_future(), buffers, lengths, longest + SIZE_EXCHANGE_BYTES)
    if any(s != OK for s in status):
        work.wait()
        errors = [
            f"rank {r}: {bytes(gathered.message(r).cpu().tolist()).decode('utf-8', 'replace')}"
            for r, s in enumerate(status)
            if s != OK
        ]
        raise RemoteError("gradient compression failed on " + "; ".join(errors))
    return gathered


def encode_error(exc: BaseException, device: torch.device) -> torch.Tensor:
    """An error message as the uint8 tensor a failing rank sends instead of its payload."""
    text = f"{type(exc).__name__}: {exc}".encode("utf-8")[:4096]
    return torch.tensor(list(text), dtype=torch.uint8, device=device)


def allreduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.futures.Future:
    """Launch an in-place sum all-reduce of ``tensor``; the future's value is ``[tensor]``."""
    return dist.all_reduce(tensor, group=group, async_op=True).get_future()
