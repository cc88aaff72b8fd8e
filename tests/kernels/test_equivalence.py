"""The kernels' equivalence battery: every form of every kernel present here, on every device present, against its
eager reference (theory/kernels/catalog.py), bit for bit or within the rounding the kernel declares.

Inputs span the cases the forms treat differently: lengths around the C loops' 16-element steps and their
thread pieces, both float dtypes, zeros, ties at the threshold, values at 1e-30 and 1e30, subnormals, and NaN
where the kernel defines what NaN does; the bounded selection's buffers with no room, less room than it selects,
exactly enough and more. A form that does not exist for an input (no extension built, no compiler,
another device) is skipped, and the test says which forms ran.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from gradstat.theory.kernels import catalog, counter_dither, native, nested, peaks, primitives

Case = Callable[[torch.device], tuple[Any, ...]]
"""A case builds fresh arguments on a device (kernels write into their ``out`` argument)."""


def _laplace(n: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-scale * torch.sign(u) * torch.log1p(-2 * u.abs())).to(dtype)


def _with_specials(x: torch.Tensor, ties: float) -> torch.Tensor:
    """Zeros, exact ties at ``ties`` (both signs) and a subnormal, spread over the vector."""
    x = x.clone()
    n = x.numel()
    if n >= 8:
        x[:: max(1, n // 7)] = 0.0
        x[1 :: max(2, n // 5)] = ties
        x[2 :: max(3, n // 3)] = -ties
        x[-1] = torch.finfo(x.dtype).tiny / 4
    return x


SIZES = (1, 15, 16, 17, 1000, 70_001)
"""Around the C loops' 16-element step, one short and one long vector (the long one also runs in thread pieces)."""


def _selection_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for n in SIZES:
        for dtype in (torch.float32, torch.float64):
            for scale in (1.0, 1e-30, 1e30):
                for signed in (True, False):
                    name = f"n={n}-{str(dtype)[6:]}-scale={scale:g}-{'signed' if signed else 'magnitudes'}"

                    def make(device, n=n, dtype=dtype, scale=scale, signed=signed):
                        x = _with_specials(_laplace(n, 7, scale, dtype), 1.5 * scale)
                        x = x if signed else x.abs()
                        return x.to(device), 1.5 * scale, signed

                    cases[name] = make
    cases["threshold-0-selects-every-nonzero"] = lambda device: (
        _with_specials(_laplace(999, 1), 1.0).to(device),
        0.0,
        True,
    )
    cases["threshold-inf-selects-nothing"] = lambda device: (_laplace(999, 2).to(device), math.inf, True)
    cases["nan-never-selected"] = lambda device: (
        torch.tensor([1.0, math.nan, -3.0, math.nan, 0.5] * 9, device=device),
        0.75,
        True,
    )
    cases["n=1-infinity"] = lambda device: (torch.tensor([-math.inf], device=device), 0.75, True)
    return cases


CAPACITIES: dict[str, Callable[[int], int]] = {
    "0": lambda count: 0,
    "below": lambda count: count // 2,
    "equal": lambda count: count,
    "above": lambda count: count + 5,
}
"""The bounded selection's buffer sizes, from the number of elements the case selects (``below`` keeps half of them;
it is 0 where a case selects at most one)."""


def _bounded_cases() -> dict[str, Case]:
    """Every selection case with its threshold as a 0-d float64 tensor on the device, at each of :data:`CAPACITIES`."""
    cases: dict[str, Case] = {}
    for name, selection in _selection_cases().items():
        for room, capacity_of in CAPACITIES.items():

            def make(device, selection=selection, capacity_of=capacity_of):
                x, t, signed = selection(device)
                count = primitives.select_at_least_reference(x.cpu(), t, signed).numel()
                return x, torch.tensor(t, dtype=torch.float64, device=device), signed, capacity_of(count)

            cases[f"{name}-capacity={room}"] = make
        if name.startswith(("n=1-", "n=70001-float32", "nan", "threshold")):
            # with the largest magnitude from the count's read (+inf where a NaN is held)
            cases[f"{name}-extremes"] = lambda device, make=cases[f"{name}-capacity=equal"]: (*make(device), True)
        if name.startswith(("n=1-", "n=70001-", "nan", "threshold")):
            for room in CAPACITIES:  # with the tie-break's count (and the largest magnitude)
                make = cases[f"{name}-capacity={room}"]
                cases[f"{name}-capacity={room}-ties"] = lambda device, make=make: (*make(device), True, True)
    for room, capacity_of in CAPACITIES.items():
        for dtype in (torch.float32, torch.float64):
            # magnitudes 1, 2 and 3 in every block, the smallest selected (2) tied across blocks, and a buffer that
            # ends among them (below), on them (equal) or past them (above)

            def tied(device, dtype=dtype, capacity_of=capacity_of):
                x = (torch.arange(5003) * 7919 % 3 + 1).to(dtype) * torch.where(torch.arange(5003) % 5 < 2, -1, 1)
                count = int((x.abs() >= 2).sum())
                return x.to(device), torch.tensor(2.0, dtype=torch.float64, device=device), True, capacity_of(count)

            cases[f"tied-magnitudes-{str(dtype)[6:]}-capacity={room}-ties"] = lambda device, tied=tied: (
                *tied(device),
                False,
                True,
            )
    # with the sub-block maxima of x (theory/kernels/peaks.py): the sub-blocks below the threshold left unread
    for name in [c for c in cases if c.startswith(("n=70001-", "nan", "threshold", "tied")) and "extremes" not in c]:

        def with_peaks(device, make=cases[name]):
            x, t, signed, capacity, *flags = make(device)
            return x, t, signed, capacity, False, bool(flags[1:] and flags[1]), peaks.reference(x, peaks.sub_for(x))

        cases[f"{name}-peaks"] = with_peaks
    for dtype in (torch.float32, torch.float64):
        # sub-blocks whose largest magnitude is the threshold itself (read: |x| >= t selects it), above it and below

        def at_peak(device, dtype=dtype):
            x = torch.tensor([2.0, -1.0, 0.5, 1.5, -3.0, 1.0, 0.0, 1.0, 1.0, 1.0, -1.0, 0.25] * 700, dtype=dtype)
            x[5::97] = -2.0
            sub = peaks.sub_for(x.to(device))
            return (
                x.to(device),
                torch.tensor(2.0, dtype=torch.float64, device=device),
                True,
                2000,
                False,
                True,
                (peaks.reference(x.to(device), sub)),
            )

        cases[f"peak-at-the-threshold-{str(dtype)[6:]}-peaks"] = at_peak
    return cases


def _f64(v: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64, device=device)


def _statistics_cases() -> dict[str, dict[str, Case]]:
    summary: dict[str, Case] = {}
    tails: dict[str, Case] = {}
    excess: dict[str, Case] = {}
    for n in (1, 17, 1000, 70_001):
        for dtype in (torch.float32, torch.float64):
            for scale in (1.0, 1e-30, 1e30):
                tag = f"n={n}-{str(dtype)[6:]}-scale={scale:g}"

                def x_of(device, n=n, dtype=dtype, scale=scale):
                    return _with_specials(_laplace(n, 11, scale, dtype), scale).to(device)

                for absolute in (True, False):
                    for extremes, squares in ((True, True), (False, True), (True, False)):
                        if not extremes and not absolute:
                            continue
                        summary[f"{tag}-abs={absolute}-ext={extremes}-sq={squares}"] = (
                            lambda device, f=x_of, a=absolute, e=extremes, s=squares: (f(device), a, e, s)
                        )
                summary[f"{tag}-logs"] = lambda device, f=x_of: (f(device), True, True, False, True)
                for logs in (False, True):
                    tails[f"{tag}-logs={logs}"] = lambda device, f=x_of, logs=logs, scale=scale: (
                        f(device),
                        _f64(0.5 * scale, device),
                        _f64(0.0 if logs else 0.5 * scale, device),
                        _f64(1.0 / scale, device),
                        logs,
                    )
                excess[tag] = lambda device, f=x_of, scale=scale: (f(device), _f64(0.7 * scale, device))
    for name, special in (("nan", math.nan), ("inf", math.inf), ("minus-inf", -math.inf)):
        for n in (17, 70_001):

            def with_special(device, n=n, special=special):
                x = _laplace(n, 12)
                x[n // 2] = special
                return x.to(device)

            for absolute in (True, False):
                summary[f"n={n}-{name}-abs={absolute}"] = lambda device, f=with_special, a=absolute: (f(device), a)
            summary[f"n={n}-{name}-logs"] = lambda device, f=with_special: (f(device), True, True, True, True)
            excess[f"n={n}-{name}"] = lambda device, f=with_special: (f(device), _f64(0.7, device))
            tails[f"n={n}-{name}"] = lambda device, f=with_special: (
                f(device),
                _f64(0.5, device),
                _f64(0.5, device),
                _f64(1.0, device),
                False,
            )
    for n in (17, 70_001):

        def with_ties(device, n=n):  # elements at exactly the threshold, of both signs (not used: > only)
            x = _laplace(n, 13)
            x[n // 5 :: 7] = x[n // 3]
            x[n // 4 :: 11] = -x[n // 3]
            return x.to(device)

        # count_excess counts |x| >= t: the elements at exactly t, of both signs, are in (the Triton form compares
        # with the float64 just below t)
        excess[f"n={n}-ties"] = lambda device, f=with_ties, n=n: (f(device), f(device)[n // 3].abs().double())
        excess[f"n={n}-t=0"] = lambda device, f=with_ties: (f(device), _f64(0.0, device))
        for name, t in (("inf", math.inf), ("nan", math.nan), ("tiny", 5e-324)):
            excess[f"n={n}-t={name}"] = lambda device, f=with_ties, t=t: (f(device), _f64(t, device))
        for logs in (False, True):
            tails[f"n={n}-ties-logs={logs}"] = lambda device, f=with_ties, logs=logs, n=n: (
                f(device),
                f(device)[n // 3].abs().double(),
                _f64(0.0 if logs else 0.25, device),
                _f64(2.0, device),
                logs,
            )
    return {"summary": summary, "tail_moments": tails, "count_excess": excess}


def _block_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for rows in (1, 3, 1000):
        for absolute in (True, False):
            cases[f"rows={rows}-abs={absolute}"] = lambda device, r=rows, a=absolute: (
                _laplace(r * 64, 5).reshape(r, 64).to(device),
                a,
            )
    return cases


def _sign_split_cases() -> dict[str, Case]:
    return {
        f"n={n}-scale={s:g}": (lambda device, n=n, s=s: (_with_specials(_laplace(n, 3, s), s).to(device),))
        for n in (1, 1000, 70_001)
        for s in (1.0, 1e-30, 1e30)
    }


def _key(device: torch.device, seed: int = 5) -> torch.Tensor:
    return counter_dither.keys(seed, 1, device)


def _base(value: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int32, device=device)


ROW_SHAPES = ((1, 1), (1, 17), (3, 64), (1, 70_001), (40, 512))


def _rows_cases() -> dict[str, dict[str, Case]]:
    quantize: dict[str, Case] = {}
    reconstruct: dict[str, Case] = {}
    signed: dict[str, Case] = {}
    for rows, size in ROW_SHAPES:
        for scale in (1.0, 1e-30, 1e30):
            tag = f"{rows}x{size}-scale={scale:g}"

            def block(device, rows=rows, size=size, scale=scale):
                x = _laplace(rows * size, 9, scale).reshape(rows, size).to(device)
                return x, x.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)

            for gain, lo, hi, shift in ((2.0, -2, 2, 0.0), (127.0, -127, 127, 0.5)):
                quantize[f"{tag}-levels={hi}-shift={shift}"] = lambda device, b=block, g=gain, lo=lo, hi=hi, sh=shift: (
                    torch.empty(b(device)[0].shape, dtype=torch.int8, device=device),
                    *b(device),
                    _base(3, device),
                    _key(device),
                    g,
                    lo,
                    hi,
                    sh,
                    torch.int8,
                )
            for subtract in (True, False):
                reconstruct[f"{tag}-subtract={subtract}"] = lambda device, b=block, s=subtract: (
                    torch.empty(b(device)[0].shape, dtype=torch.float32, device=device),
                    torch.randint(-127, 128, b(device)[0].shape, generator=torch.Generator().manual_seed(4))
                    .to(torch.int8)
                    .to(device),
                    b(device)[1],
                    _base(5, device),
                    _key(device),
                    127.0,
                    0.0,
                    s,
                )
            for divide in (True, False):
                signed[f"{tag}-divide={divide}"] = lambda device, b=block, dv=divide: (
                    torch.empty(b(device)[0].shape, dtype=torch.float32, device=device),
                    *b(device),
                    _base(0, device),
                    _key(device),
                    dv,
                )
    keys: dict[str, Case] = {}
    for rows, size in ROW_SHAPES:
        for first in (0, 3, 2**31 - 1 - rows * size):  # (the last: counters up to the largest int32)
            keys[f"{rows}x{size}-base={first}"] = lambda device, rows=rows, size=size, first=first: (
                torch.empty((rows, size), dtype=torch.float32, device=device),
                torch.ones((rows, 1), device=device),
                _base(first, device),
                _key(device),
            )
    samples: dict[str, Case] = {}
    for rows, size in ROW_SHAPES:
        for d in (1, 7, 2**31 - 1):  # (the largest: products near 2^63)
            samples[f"{rows}x{size}-d={d}"] = lambda device, rows=rows, size=size, d=d: (
                torch.empty((rows, size), dtype=torch.int64, device=device),
                torch.ones((rows, 1), device=device),
                _base(11, device),
                _key(device),
                d,
            )
    return {
        "quantize_rows": quantize,
        "reconstruct_rows": reconstruct,
        "signed_rows": signed,
        "hash_keys": keys,
        "sample_indices": samples,
    }


def _nested_cases() -> dict[str, dict[str, Case]]:
    encode: dict[str, Case] = {}
    estimate: dict[str, Case] = {}
    for n in (1, 17, 70_001):
        for alpha, delta1, k in ((1.0, 1 / 3, 3), (0.7, 0.25, 5), (1.0, 0.2, 7)):
            tag = f"n={n}-alpha={alpha}-delta1={delta1:.3g}-k={k}"

            def parts(device, n=n, alpha=alpha, delta1=delta1, k=k):
                g = _laplace(n, 21).reshape(1, n).to(device)
                kappa = g.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
                codes = torch.empty(g.shape, dtype=torch.int8, device=device)
                nested.NESTED_KERNELS[0].reference(codes, g, kappa, _base(0, device), _key(device), alpha, delta1, k)
                side = g + 0.05 * _laplace(n, 22).reshape(1, n).to(device) * kappa
                return g, kappa, codes, side

            encode[tag] = lambda device, p=parts, alpha=alpha, delta1=delta1, k=k: (
                torch.empty((1, p(device)[0].shape[1]), dtype=torch.int8, device=device),
                p(device)[0],
                p(device)[1],
                _base(0, device),
                _key(device),
                alpha,
                delta1,
                k,
            )
            estimate[tag] = lambda device, p=parts, alpha=alpha, delta1=delta1, k=k: (
                p(device)[2].to(torch.float32),
                p(device)[3],
                p(device)[1],
                _base(0, device),
                _key(device),
                alpha,
                delta1,
                k,
            )
    return {"nested_rows": encode, "nested_estimate": estimate}


def _fwht_cases() -> dict[str, Case]:
    return {
        f"{rows}x{n}": (lambda device, rows=rows, n=n: (_laplace(rows * n, 8).reshape(rows, n).to(device),))
        for rows, n in ((1, 1), (3, 4), (5, 64), (2, 256))
    }


def _gamma_cases() -> dict[str, Case]:
    """The Halley steps from the torch solver's start, at 3 and 4 steps: SIDCo's shapes and conditional ratios
    (q >= delta_1), far tails of both branches, and shapes from 1e-3 to 1e4."""
    from gradstat.theory.distributions import incgamma

    grids = {
        "sidco": ([0.08, 0.3, 0.7, 1.0, 1.6, 4.0], [0.25, 0.31, 0.5, 0.8, 0.97, 1 - 1e-9]),
        "far-tails": ([0.01, 0.5, 2.0, 30.0], [1e-300, 1e-40, 1e-8, 1 - 1e-16]),
        "shapes": ([1e-3, 0.05, 5.0, 300.0, 1e4], [1e-6, 0.25, 0.9]),
    }
    cases: dict[str, Case] = {}
    for name, (shapes, qs) in grids.items():
        for steps in (incgamma.MODERATE_STEPS, incgamma.STEPS):

            def make(device, shapes=shapes, qs=qs, steps=steps):
                a, q = (torch.tensor(v, dtype=torch.float64).reshape(-1) for v in np.meshgrid(shapes, qs))
                logp, logq = torch.log1p(-q), torch.log(q)
                lgam, lgam1 = torch.lgamma(a), torch.lgamma(a + 1.0)
                start = torch.maximum(torch.log(incgamma._initial_guess(a, logp, logq)), (logp + lgam1) / a)
                return (*(v.to(device) for v in (a, logp, logq, lgam, lgam1, start)), steps)

            cases[f"{name}-steps={steps}"] = make
    return cases


def _hashes_below_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for d in (1, 17, 70_001):
        # (none pass; a few per thousand; about half; all but the largest hash, which the C loop's AVX2 comparison
        # and its scalar one must both leave out; all)
        for cut in (-(2**31) - 1, -(2**31), -(2**31) + 2**22, 0, 2**31 - 1, 2**31):  # (and past int32 both ways)
            for seed in (5, 6):
                cases[f"d={d}-cut={cut}-seed={seed}"] = lambda device, d=d, cut=cut, seed=seed: (
                    _key(device, seed),
                    d,
                    cut,
                    8,
                )
    return cases


CASES: dict[str, dict[str, Case]] = {
    "select": _selection_cases(),
    "gather": _selection_cases(),
    "select_bounded": _bounded_cases(),
    **_statistics_cases(),
    "block_max": _block_cases(),
    "sign_split_sums": _sign_split_cases(),
    **_rows_cases(),
    "hashes_below": _hashes_below_cases(),
    **_nested_cases(),
    "fwht": _fwht_cases(),
    "gamma_halley": _gamma_cases(),
}

PARAMS = [pytest.param(kernel, case, id=f"{kernel}-{case}") for kernel, cases in CASES.items() for case in cases]


def test_every_kernel_of_the_catalog_has_cases_and_every_case_a_kernel():
    assert set(CASES) == set(catalog.KERNELS)
    assert all(CASES[name] for name in CASES)


def _equal(got: Any, want: Any, rtol: float, where: str, bound: torch.Tensor | None = None) -> None:
    if want is None:
        assert got is None, f"{where}: {type(got).__name__}, the reference None"
        return
    if dataclasses.is_dataclass(want) and not isinstance(want, type):
        assert type(got) is type(want), f"{where}: {type(got).__name__}, the reference {type(want).__name__}"
        for f in dataclasses.fields(want):
            _equal(getattr(got, f.name), getattr(want, f.name), rtol, f"{where}.{f.name}")
        return
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _equal(a, b, rtol, f"{where}[{i}]")
        return
    assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{tuple(got.shape)}"
    assert got.device == want.device, f"{where}: on {got.device}, the reference on {want.device}"
    if bound is not None:
        both_nan = torch.isnan(got) & torch.isnan(want)
        close = ((got - want).abs() <= bound) | both_nan | (got == want)
        assert bool(close.all()), f"{where}: {got.tolist()} vs {want.tolist()}, allowed {bound.tolist()}"
    elif rtol == 0.0 or not want.is_floating_point():
        assert torch.equal(got, want) or (want.is_floating_point() and _nan_equal(got, want)), where
    else:
        torch.testing.assert_close(got, want, rtol=rtol, atol=0.0, equal_nan=True, msg=where)


def _nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def _result(out: Any, args: tuple[Any, ...]) -> Any:
    """What a call produced: its return value (kernels that write ``out`` also return it)."""
    return out.clone() if isinstance(out, torch.Tensor) else out


@pytest.mark.parametrize(("kernel", "case"), PARAMS)
def test_every_form_present_equals_the_reference(kernel, case, device):
    k = catalog.KERNELS[kernel]
    make = CASES[kernel][case]
    args = make(device)
    want = _result(k.reference(*args), ())
    bound = None if k.bound is None else k.bound(args, want)
    ran = []
    for name, form in k.present(*make(device)):
        got = _result(form.run(*make(device)), ())
        _equal(got, want, k.rtol, f"{kernel} {case}: form {name!r}", bound)
        ran.append(name)
        if name == "native" and (ext := native.extension()) is not None and ext.avx2():
            before = ext.set_avx2(False)  # the portable scalar loops too, on this machine
            try:
                got = _result(form.run(*make(device)), ())
            finally:
                ext.set_avx2(before)
            _equal(got, want, k.rtol, f"{kernel} {case}: form 'native' without AVX2", bound)
            ran.append("native (scalar)")
    if not ran:
        pytest.skip(f"no accelerated form of {kernel} exists here for this input (device {device})")
