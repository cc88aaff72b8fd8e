"""gradstat: statistical analysis and theory validation for gradient compression in distributed deep learning.

The installed namespace has three layers, each a folder at the top of the source tree:

- :mod:`gradstat.theory` — the papers' closed forms, distributions and estimators (imports nothing of the project);
- :mod:`gradstat.compressors` — every compressor under one contract, error feedback, momentum (imports ``theory``);
- :mod:`gradstat.analysis` — dumps, training, studies, validation, plots, report and the command line.

The main entry points are re-exported here::

    import gradstat
    c = gradstat.create("topk:ratio=0.01")
    d = gradstat.open_dump("my-dump")
    est = gradstat.fit(d.flat(d.steps[-1]).abs(), "gamma", "mle")
"""

from __future__ import annotations

import os as _os

# In a source checkout (and in an editable install run from one) the three layers live beside this folder, not in
# it; a regular install copies them inside. Look in both places so ``python -m pytest`` from the checkout, where the
# checkout's ``gradstat/`` shadows the installed package, resolves ``gradstat.theory`` to the same files.
_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "theory")) and _os.path.isfile(
    _os.path.join(_checkout, "theory", "__init__.py")
):
    __path__.append(_checkout)

__version__ = "0.1.0"

__all__ = ["Context", "create", "fit", "open_dump", "__version__"]


def __getattr__(name: str) -> object:
    """Lazy entry points: ``import gradstat`` stays cheap (no torch import until one is used)."""
    if name in ("create", "Context"):
        from gradstat import compressors

        return getattr(compressors, name)
    if name == "open_dump":
        from gradstat.analysis.dumps import open_dump

        return open_dump
    if name == "fit":
        from gradstat.theory.estimators import fit

        return fit
    raise AttributeError(f"module 'gradstat' has no attribute {name!r}")
