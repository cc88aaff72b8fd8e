"""DDP communication hooks for every registered compressor (torch ``ddp_comm_hooks`` style).

- :func:`make_hook` / :func:`compression_hook` with :class:`CompressionHookState` (settings, per-bucket memories,
  metrics and taps): any compressor with error feedback or DGC's local momentum;
- :func:`baseline_hook`: torch's fp16/bf16 and PowerSGD hooks, measured alike;
- :mod:`~gradstat.compressors.ddp.exchange`: the padded all-gather with length and status exchange;
- :func:`register_hook` and :func:`expect_hook` (:mod:`~gradstat.compressors.ddp.launchers`): the hook on the DDP
  model under Accelerate, Lightning and torchrun, and a clear error when it never ran.
"""

from gradstat.compressors.ddp.baselines import BASELINES, BaselineState, baseline_hook
from gradstat.compressors.ddp.exchange import RemoteError
from gradstat.compressors.ddp.hook import compression_hook, make_hook, split_payloads
from gradstat.compressors.ddp.launchers import HookNeverRan, HookWatch, expect_hook, register_hook
from gradstat.compressors.ddp.state import (
    BucketMemories,
    BucketView,
    CompressionHookState,
    HookSettings,
    HookTaps,
    StepMetrics,
)

__all__ = [
    "BASELINES",
    "BaselineState",
    "BucketMemories",
    "BucketView",
    "CompressionHookState",
    "HookSettings",
    "HookNeverRan",
    "HookTaps",
    "HookWatch",
    "RemoteError",
    "StepMetrics",
    "baseline_hook",
    "compression_hook",
    "expect_hook",
    "make_hook",
    "register_hook",
    "split_payloads",
]
