"""gradstat compressors: every compressor of the papers under one contract (see :mod:`gradstat.compressors.base`).

Importing the package registers every implementation; use :func:`gradstat.compressors.registry.create` with a
spec string.
"""

# Implementation modules (each registers its classes on import).
from gradstat.compressors.base import Compressor, Properties, RoundResult, decode_named, encode_named
from gradstat.compressors.context import Context
from gradstat.compressors.memory.feedback import ErrorFeedback, FeedbackState, parse_feedback
from gradstat.compressors.memory.send import Memory, WorkerState, parse_memory
from gradstat.compressors.registry import create, get, names, register
from gradstat.compressors.schemes.lowrank import powersgd  # noqa: F401
from gradstat.compressors.schemes.quantizers import (  # noqa: F401
    dqsg,
    ecq,
    ndqsg,
    onebit,
    qcs,
    qsgd,
    sign,
    terngrad,
)
from gradstat.compressors.schemes.sparsifiers import (  # noqa: F401
    dgc,
    gaussianksgd,
    randk,
    redsync,
    sidco,
    tailcount,
    threshold,
    topk,
    wangni,
)
from gradstat.compressors.wire.payload import Payload

__all__ = [
    "Compressor",
    "Properties",
    "RoundResult",
    "Context",
    "Payload",
    "ErrorFeedback",
    "FeedbackState",
    "parse_feedback",
    "Memory",
    "WorkerState",
    "parse_memory",
    "create",
    "get",
    "names",
    "register",
    "encode_named",
    "decode_named",
]
