"""Registry of compressors and their spec strings.

A spec is ``name`` or ``name:key=value,key=value`` (e.g. ``qcs:k=64,Q=4,block=256,alpha=unbiased``,
``topk:ratio=0.01``). Keys are the dataclass fields of the compressor class; values are converted to the
field's annotated type (int, float, bool, str, or a Literal of strings). Unknown names and keys, and values of
the wrong type, raise ``ValueError`` naming what was wrong and what is accepted.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, TypeVar

from gradstat.compressors.base import Compressor, hyper_fields

_REGISTRY: dict[str, type[Compressor]] = {}
C = TypeVar("C", bound=type[Compressor])


def register(name: str) -> Callable[[C], C]:
    """Class decorator: register a dataclass compressor under ``name``."""

    def deco(cls: C) -> C:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"compressor name {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__qualname__} must be a dataclass to be registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> type[Compressor]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown compressor {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``name:k=v,k=v`` into the name and raw string arguments; a key given twice is an error."""
    spec = spec.strip()
    if not spec:
        raise ValueError("empty compressor spec")
    name, _, rest = spec.partition(":")
    args: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"bad argument {item!r} in spec {spec!r}: expected key=value")
        key = key.strip()
        if key in args:
            raise ValueError(
                f"duplicate parameter {key!r} in spec {spec!r} ({key}={args[key]} and {key}={value.strip()}); "
                "give each parameter once"
            )
        args[key] = value.strip()
    return name.strip(), args


def create(spec: str, **overrides: Any) -> Compressor:
    """Build a compressor from a spec string; keyword ``overrides`` win over the spec's values."""
    name, raw = parse_spec(spec)
    cls = get(name)
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in hyper_fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ValueError(f"{name}: unknown parameter {key!r}; accepted: {', '.join(known) or 'none'}")
        kwargs[key] = _convert(value, hints[key], f"{name}:{key}")
    kwargs.update(overrides)
    return cls(**kwargs)


def _convert(value: str, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        for a in allowed:
            if str(a) == value:
                return a
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(str, allowed))}")
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value.lower() in ("none", "null", ""):
            return None
        errors = []
        for a in args:
            try:
                return _convert(value, a, where)
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
