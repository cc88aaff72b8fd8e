"""A planted bug and the count of its executions.

A :class:`Mutation` is a mistake in the code a validation check covers, applied by patching that code for one run
(``mock.patch`` context managers from its ``patch``). :func:`planted` applies it and counts how often each patched
replacement is called: a patch that never runs plants nothing, so a check that "survives" it says nothing about the
check (the mutation suite requires every count to be positive).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal
from unittest import mock

Kind = Literal["realistic", "gross"]
"""``realistic``: a mistake a review could miss (x1.03 or x0.97 scale, k +- 1, a sign flip, a dither kept or
doubled, a wrong seed, side information scaled, a level off by one); ``gross``: anything larger (bottom-k, k/100,
a squared scale, a forgotten factor)."""


@dataclass(frozen=True)
class Mutation:
    """A planted bug: ``check`` must turn ``violated`` while ``patch()``'s context managers are active.

    ``why`` explains a known survivor (empty when the check must kill it); ``caught_by`` names the companion
    check whose mutation of the same name kills the same bug (empty when none does); ``kind`` sorts the bug into
    the realistic or the gross set (the kill table reports their rates apart)."""

    check: str
    name: str
    bug: str
    patch: Callable[[], list]
    why: str = ""
    caught_by: str = ""
    kind: Kind = "gross"


def _counting(new: Any, counts: list[int], i: int) -> Any:
    """``new`` with each call counted in ``counts[i]`` (a plain function, so it binds as a method would)."""
    if isinstance(new, classmethod):
        return classmethod(_counting(new.__func__, counts, i))
    if isinstance(new, staticmethod):
        return staticmethod(_counting(new.__func__, counts, i))
    if not callable(new):
        return new

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[i] += 1
        return new(*args, **kwargs)

    return counted


@contextlib.contextmanager
def planted(m: Mutation) -> Iterator[list[int]]:
    """Apply ``m``'s patches for the duration of the block; yields the call count of each patch (in the order of
    ``m.patch()``; updated as the block runs). Every entry of ``m.patch()`` must be a ``mock.patch`` of a callable:
    an uncounted context manager would let a mutation plant its bug where nothing runs."""
    patches = m.patch()
    counts = [0] * len(patches)
    with contextlib.ExitStack() as stack:
        for i, cm in enumerate(patches):
            new = getattr(cm, "new", None)
            if not isinstance(cm, mock._patch) or not (callable(new) or isinstance(new, classmethod)):
                raise TypeError(f"{m.check}/{m.name}: every patch must be a mock.patch of a callable, got {cm!r}")
            cm.new = _counting(cm.new, counts, i)
            stack.enter_context(cm)
        yield counts
