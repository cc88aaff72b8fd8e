"""gradstat compressors: every compressor of the papers under one contract (see :mod:`compressors.base`).

Importing the package registers every implementation; use :func:`compressors.registry.create` with a spec string.
"""
from compressors.base import Compressor, Properties, RoundResult, decode_named, encode_named
from compressors.context import Context
from compressors.feedback import ErrorFeedback, FeedbackState, parse_feedback
from compressors.payload import Payload
from compressors.registry import create, get, names, register

# Implementation modules (each registers its classes on import).
from compressors import topk  # noqa: F401,E402
from compressors import threshold  # noqa: F401,E402
from compressors import randk  # noqa: F401,E402
from compressors import wangni  # noqa: F401,E402
from compressors import dgc  # noqa: F401,E402
from compressors import redsync  # noqa: F401,E402
from compressors import gaussianksgd  # noqa: F401,E402
from compressors import sidco  # noqa: F401,E402
from compressors import qsgd  # noqa: F401,E402
from compressors import terngrad  # noqa: F401,E402
from compressors import onebit  # noqa: F401,E402
from compressors import sign  # noqa: F401,E402
from compressors import ecq  # noqa: F401,E402
from compressors import dqsg  # noqa: F401,E402
from compressors import qcs  # noqa: F401,E402
from compressors import ndqsg  # noqa: F401,E402

__all__ = [
    "Compressor", "Properties", "RoundResult", "Context", "Payload", "ErrorFeedback", "FeedbackState",
    "parse_feedback", "create", "get", "names", "register", "encode_named", "decode_named",
]
