"""Types of the C extension built from ``_native.c`` (see :mod:`gradstat.theory.kernels.native`)."""

from typing import Any

SOURCE_DIGEST: str
MULTIPLIERS: tuple[int, int]

def select_f32(
    x: Any, start: int, end: int, t: float, absolute: bool, idx: Any, vals: Any, count: int, top: float, nan: bool
) -> tuple[int, int, float, bool]: ...
def select_f64(
    x: Any, start: int, end: int, t: float, absolute: bool, idx: Any, vals: Any, count: int, top: float, nan: bool
) -> tuple[int, int, float, bool]: ...
def quantize_rows(
    x: Any,
    rows: int,
    size: int,
    scale: Any,
    base: int,
    k0: int,
    k1: int,
    gain: float,
    lo: float,
    hi: float,
    shift: float,
    out: Any,
) -> None: ...
def reconstruct_rows(
    codes: Any,
    rows: int,
    size: int,
    scale: Any,
    base: int,
    k0: int,
    k1: int,
    gain: float,
    offset: float,
    subtract: bool,
    out: Any,
) -> None: ...
def nested_rows(
    g: Any, kappa: float, base: int, k0: int, k1: int, alpha: float, delta1: float, k: float, h: float, out: Any
) -> None: ...
def nested_estimate(
    s: Any,
    side: Any,
    kappa: float,
    base: int,
    k0: int,
    k1: int,
    alpha: float,
    shrink: bool,
    delta1: float,
    k: float,
    step: float,
    out: Any,
) -> None: ...
def summary_f32(
    x: Any, start: int, end: int, absolute: bool, extremes: bool, squares: bool
) -> tuple[float, float, int, float, float, float, bool]: ...
def tail_f32(
    x: Any, start: int, end: int, above: float, shift: float, inv_unit: float, squares: bool
) -> tuple[int, float, float]: ...
def avx2() -> bool: ...
def set_avx2(allow: bool) -> bool: ...
