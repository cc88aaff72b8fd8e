"""gradstat compressors: every compressor of the papers under one contract (see :mod:`gradstat.compressors.base`).

Importing the package registers every implementation; use :func:`gradstat.compressors.registry.create` with a
spec string.
"""

# Implementation modules (each registers its classes on import).
from gradstat.compressors import (
    dgc,  # noqa: F401,E402
    dqsg,  # noqa: F401,E402
    ecq,  # noqa: F401,E402
    gaussianksgd,  # noqa: F401,E402
    ndqsg,  # noqa: F401,E402
    onebit,  # noqa: F401,E402
    powersgd,  # noqa: F401,E402
    qcs,  # noqa: F401,E402
    qsgd,  # noqa: F401,E402
    randk,  # noqa: F401,E402
    redsync,  # noqa: F401,E402
    sidco,  # noqa: F401,E402
    sign,  # noqa: F401,E402
    tailcount,  # noqa: F401,E402
    terngrad,  # noqa: F401,E402
    threshold,  # noqa: F401,E402
    topk,  # noqa: F401,E402
    wangni,  # noqa: F401,E402
)
from gradstat.compressors.base import Compressor, Properties, RoundResult, decode_named, encode_named
from gradstat.compressors.context import Context
from gradstat.compressors.feedback import ErrorFeedback, FeedbackState, parse_feedback
from gradstat.compressors.payload import Payload
from gradstat.compressors.registry import create, get, names, register

__all__ = [
    "Compressor",
    "Properties",
    "RoundResult",
    "Context",
    "Payload",
    "ErrorFeedback",
    "FeedbackState",
    "parse_feedback",
    "create",
    "get",
    "names",
    "register",
    "encode_named",
    "decode_named",
]
