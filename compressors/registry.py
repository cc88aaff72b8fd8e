"""Registry of compressors and their spec strings.

A spec is ``name`` or ``name:key=value,key=value`` in the one grammar of :mod:`gradstat.compressors.spec` (e.g.
``qcs:k=64,Q=4,block=256,alpha=unbiased``, ``topk:ratio=0.01``). Keys are the dataclass fields of the compressor
class; values are converted to the field's annotated type (int, float, bool, str, or a Literal of strings). Unknown
names and keys, and values of the wrong type, raise ``ValueError`` naming what was wrong and what is accepted.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, TypeVar

from gradstat.compressors.base import Compressor, hyper_fields
from gradstat.compressors.spec import convert, parse_spec

__all__ = ["create", "get", "names", "parse_spec", "register"]

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
        kwargs[key] = convert(value, hints[key], f"{name}:{key}")
    kwargs.update(overrides)
    return cls(**kwargs)
