"""gradstat compressors: every compressor of the papers under one contract (see :mod:`gradstat.compressors.base`).

Importing the package registers every implementation; use :func:`gradstat.compressors.registry.create` with a spec string.
"""
from gradstat.compressors.base import Compressor, Properties, RoundResult, decode_named, encode_named
from gradstat.compressors.context import Context
from gradstat.compressors.feedback import ErrorFeedback, FeedbackState, parse_feedback
from gradstat.compressors.payload import Payload
from gradstat.compressors.registry import create, get, names, register

# Implementation modules (each registers its classes on import).
from gradstat.compressors import topk  # noqa: F401,E402
from gradstat.compressors import threshold  # noqa: F401,E402
from gradstat.compressors import randk  # noqa: F401,E402
from gradstat.compressors import wangni  # noqa: F401,E402
from gradstat.compressors import dgc  # noqa: F401,E402
from gradstat.compressors import redsync  # noqa: F401,E402
from gradstat.compressors import gaussianksgd  # noqa: F401,E402
from gradstat.compressors import sidco  # noqa: F401,E402
from gradstat.compressors import qsgd  # noqa: F401,E402
from gradstat.compressors import terngrad  # noqa: F401,E402
from gradstat.compressors import onebit  # noqa: F401,E402
from gradstat.compressors import sign  # noqa: F401,E402
from gradstat.compressors import ecq  # noqa: F401,E402
from gradstat.compressors import dqsg  # noqa: F401,E402
from gradstat.compressors import qcs  # noqa: F401,E402
from gradstat.compressors import ndqsg  # noqa: F401,E402

__all__ = [
    "Compressor", "Properties", "RoundResult", "Context", "Payload", "ErrorFeedback", "FeedbackState",
    "parse_feedback", "create", "get", "names", "register", "encode_named", "decode_named",
]
