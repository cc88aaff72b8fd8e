"""The one spec grammar of gradstat: ``name`` or ``name:key=value,key=value``.

Every spec a user writes goes through :func:`parse_spec` and :func:`convert`: compressors
(``topk:ratio=0.01``, :func:`gradstat.compressors.registry.create`), error feedback (``qcs:beta=0.3``) and
DGC's local momentum (``dgc:momentum=0.9,masking=false``), both read by
:func:`gradstat.compressors.memory.send.parse_memory`. Whitespace around names, keys and values is ignored; an
empty spec, an item without ``=``, an empty key and a key given twice are errors that quote the spec.

:func:`convert` reads one value as a Python type (int, float, bool, str, a ``Literal`` of strings, or an optional
of these), naming ``where`` in its error.
"""

from __future__ import annotations

import types
import typing
from typing import Any


def parse_spec(spec: str, what: str = "compressor") -> tuple[str, dict[str, str]]:
    """Split ``name:k=v,k=v`` into the name and the raw string arguments. ``what`` names the kind of spec in errors
    (``compressor``, ``feedback``)."""
    if not isinstance(spec, str):
        raise TypeError(f"a {what} spec must be a string, got {type(spec).__name__}")
    spec = spec.strip()
    if not spec:
        raise ValueError(f"empty {what} spec")
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"{what} spec {spec!r} has no name before ':'")
    args: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"bad argument {item!r} in {what} spec {spec!r}: expected key=value")
        if key in args:
            raise ValueError(
                f"duplicate parameter {key!r} in {what} spec {spec!r} ({key}={args[key]} and {key}={value.strip()}); "
                "give each parameter once"
            )
        args[key] = value.strip()
    return name, args


def convert(value: str, tp: Any, where: str) -> Any:
    """``value`` read as type ``tp``; a ``ValueError`` naming ``where`` and what is accepted otherwise."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        for a in allowed:
            if str(a) == value:
                return a
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(str, allowed))}")
    if origin in (typing.Union, getattr(types, "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value.lower() in ("none", "null", ""):
            return None
        errors = []
        for a in args:
            try:
                return convert(value, a, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(f"{where}: cannot read {value!r} ({'; '.join(errors)})")
    if tp is bool:
        low = value.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{where}: expected a boolean (true/false), got {value!r}")
    if tp in (int, float):
        try:
            return tp(value) if tp is float else int(value, 0)
        except ValueError:
            raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    if tp is str:
        return value
    raise ValueError(f"{where}: parameter of type {tp} cannot be set from a spec string")
