"""Gradient dumps: a directory of one safetensors file per recorded step plus a JSON manifest.

Specification: ``data/README.md``. Write with :class:`DumpWriter`, read with :func:`open_dump`; every problem
with a dump raises :class:`DumpError` (a ``ValueError``) naming the file and what is wrong.
"""

from gradstat.analysis.dumps.format import FORMAT_VERSION, STORAGE_DTYPES, DumpError
from gradstat.analysis.dumps.reader import Dump, open_dump
from gradstat.analysis.dumps.writer import DumpWriter

__all__ = ["Dump", "DumpError", "DumpWriter", "FORMAT_VERSION", "STORAGE_DTYPES", "open_dump"]
