"""DDP communication hooks for every registered compressor (torch ``ddp_comm_hooks`` style).

- :func:`make_hook` / :func:`compression_hook` with :class:`CompressionHookState`: any compressor + feedback;
- :func:`baseline_hook`: torch's fp16/bf16 and PowerSGD hooks, measured alike;
- :mod:`~gradstat.compressors.ddp.exchange`: the padded all-gather with length and status exchange.
"""

from gradstat.compressors.ddp.baselines import BASELINES, BaselineState, baseline_hook
from gradstat.compressors.ddp.exchange import RemoteError
from gradstat.compressors.ddp.hook import compression_hook, decode_all, make_hook, split_payloads
from gradstat.compressors.ddp.state import BucketView, CompressionHookState, StepMetrics

__all__ = [
    "BASELINES",
    "BaselineState",
    "BucketView",
    "CompressionHookState",
    "RemoteError",
    "StepMetrics",
    "baseline_hook",
    "compression_hook",
    "decode_all",
    "make_hook",
    "split_payloads",
]
