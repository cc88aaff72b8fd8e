"""Registry of built-in workloads, addressed by spec strings ``name`` or ``name:key=value,...``."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, TypeVar

from gradstat.analysis.training.workloads.base import Workload

_REGISTRY: dict[str, type[Workload]] = {}
W = TypeVar("W", bound=type[Workload])


def register(cls: W) -> W:
    """Class decorator: register a workload dataclass under its ``name``."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"workload class {cls.__qualname__} needs a unique name, got {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def workload_names() -> list[str]:
    """Names of the registered workloads, in registration order."""
    return list(_REGISTRY)


def get_workload(spec: str) -> Workload:
    """Build a workload from ``name`` or ``name:key=value,...`` (keys: the workload's fields).

    Raises
    ------
    ValueError
        unknown name, unknown key, or a value of the wrong type, naming what is accepted.
    """
    name, _, rest = str(spec).strip().partition(":")
    if name not in _REGISTRY:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(_REGISTRY)}")
    cls = _REGISTRY[name]
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or key not in known:
            raise ValueError(f"workload {name!r}: bad setting {item!r}; accepted keys: {', '.join(sorted(known))}")
        kwargs[key] = _convert(value, hints[key], f"{name}:{key}")
    return cls(**kwargs)


def _convert(value: str, tp: Any, where: str) -> Any:
    if typing.get_origin(tp) is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(typing.get_args(tp))}")
    caster: Callable[[str], Any] = {int: int, float: float, str: str}.get(tp)  # type: ignore[assignment]
    if caster is None:
        raise ValueError(f"{where}: cannot be set from a spec string")
    try:
        return caster(value)
    except ValueError:
        raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}") from None
