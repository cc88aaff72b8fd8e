"""Every hot loop of the kernels layer, with its eager reference and each accelerated form it has.

One entry per kernel (:class:`Kernel`): the reference (plain eager torch, the definition), and its forms
(:class:`Form`), each a callable with the reference's signature that runs exactly that form, and a predicate that
says whether the form exists for an input (the C loops need a contiguous CPU tensor of a dtype they handle and the
extension built; a compiled form needs a compiler for the input's device). Which form a call runs in normal use is
decided by :mod:`gradstat.theory.kernels.policy`; this table is what the equivalence battery (``tests/kernels``)
and ``gradstat bench`` iterate over: every form present, on every device present, against the reference, bit for
bit or within the rounding the kernel declares (:attr:`Kernel.rtol`: float64 sums accumulated in another order).

Bit packing is not here: it lives with the wire format (:mod:`gradstat.compressors.wire.bitpack`), as one
device-agnostic form (integer shifts and masks in torch), which the wire tests check against a plain reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from gradstat.theory.kernels import (
    bounded,
    compaction,
    counter_dither,
    counter_native,
    gamma_halley,
    hadamard,
    native,
    nested,
    policy,
    primitives,
    stage_stats,
    triton_gamma,
    triton_runtime,
    triton_select,
    triton_stats,
)
from gradstat.theory.kernels.fused import Fused


def _always(*_: Any) -> bool:
    return True


def _gamma_triton_exists(a: torch.Tensor, *_: Any) -> bool:
    return a.device.type in ("cuda", "cpu") and a.dtype == torch.float64 and triton_runtime.available()


@dataclass(frozen=True)
class Form:
    """One way to run a kernel: ``run`` takes the reference's arguments; ``applies(*args)`` says whether this form
    exists for them (device, dtype, layout, what is installed)."""

    run: Callable[..., Any]
    applies: Callable[..., bool] = _always


@dataclass(frozen=True)
class Kernel:
    """A hot loop: ``reference`` defines the result; ``forms`` name the accelerated ways to compute it. ``rtol``:
    0 for bit-for-bit agreement, else the relative difference allowed on floating results (reordered float64
    sums); integer and index results must always be equal. ``bound(args, want)``, where given, gives the absolute
    difference allowed per element of the result instead (e.g. sums of logarithms whose forms may each round an
    element's logarithm differently by an ulp)."""

    name: str
    source: str
    reference: Callable[..., Any]
    forms: dict[str, Form] = field(default_factory=dict)
    rtol: float = 0.0
    bound: Callable[[tuple[Any, ...], Any], torch.Tensor] | None = None

    def present(self, *args: Any) -> Iterator[tuple[str, Form]]:
        """The forms that exist for these arguments (in this process, on their device)."""
        for name, form in self.forms.items():
            if form.applies(*args):
                yield name, form


def compiler_for(device: torch.device) -> bool:
    """Whether ``torch.compile`` can build a kernel for ``device`` here (:func:`policy.compiler_for`)."""
    return policy.compiler_for(device.type)


def _compiled(kernel: Fused) -> Form:
    """The compiled form of a fused kernel (its first tensor argument decides the device)."""

    def run(*args: Any) -> Any:
        with policy.forced("always"):
            if not kernel.compiled_for(args[0]):
                raise RuntimeError(f"{kernel.name}: the compiled form did not build (see the earlier warning)")
            return kernel(*args)

    return Form(
        run, lambda *args: compiler_for(args[0].device) and args[0].numel() >= 2 and kernel.may_compile(args[0])
    )


def _native(kernel: Fused) -> Form:
    """The C loop of a fused kernel that has one, where it applies."""
    assert kernel.native is not None
    return Form(kernel.native, kernel.native_for)


def _eager_policy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` under the policy ``never`` (no C loop, nothing compiled)."""

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        with policy.forced("never"):
            return fn(*args)

    return run


# -- selection: the increasing indices of |x| >= t (x >= t), and the magnitudes there ---------------------------------


def _native_select(x: torch.Tensor, t: float, signed: bool) -> torch.Tensor:
    return compaction.select(x.reshape(-1), float(primitives.positive_threshold(t, x)), signed)[0]


def _numpy_select(x: torch.Tensor, t: float, signed: bool) -> torch.Tensor:
    return primitives._select_chunked(x.reshape(-1), primitives.positive_threshold(t, x), signed)[0]


def _blocked_select(x: torch.Tensor, t: float, signed: bool) -> torch.Tensor:
    return primitives._select_blocked(x.reshape(-1), primitives.positive_threshold(t, x), signed)


def _compiled_select(x: torch.Tensor, t: float, signed: bool) -> torch.Tensor:
    with policy.forced("always"):
        return _blocked_select(x, t, signed)


def _gather_reference(x: torch.Tensor, t: float, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    indices = primitives.select_at_least_reference(x, t, signed)
    values = x.reshape(-1).index_select(0, indices)
    return indices, values.abs() if signed else values


def _native_gather(x: torch.Tensor, t: float, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    found = compaction.select(x.reshape(-1), float(primitives.positive_threshold(t, x)), signed, gather=True)
    assert found[1] is not None
    return found[0], found[1]


def _numpy_gather(x: torch.Tensor, t: float, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    found = primitives._select_chunked(x.reshape(-1), primitives.positive_threshold(t, x), signed, gather=True)
    assert found[1] is not None
    return found[0], found[1]


def _triton_select(x: torch.Tensor, t: float, signed: bool) -> torch.Tensor:
    return triton_select.select_exact(x.reshape(-1), primitives.positive_threshold(t, x), signed, False)[0]


def _triton_gather(x: torch.Tensor, t: float, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    indices, values, _ = triton_select.select_exact(x.reshape(-1), primitives.positive_threshold(t, x), signed, False)
    return indices, values.abs() if signed else values


def _triton_exists(x: torch.Tensor, *_: Any) -> bool:
    """The exact selection's Triton form: compiled on CUDA, interpreted on a CPU (never chosen there in use)."""
    return x.device.type in ("cuda", "cpu") and x.dtype in bounded.DTYPES and triton_runtime.available()


def _cpu_numpy(x: torch.Tensor, *_: Any) -> bool:
    return primitives.cpu_contiguous(x.reshape(-1))


def _native_select_applies(x: torch.Tensor, *_: Any) -> bool:
    return compaction.available(x.reshape(-1))


# -- counter-dither rows ----------------------------------------------------------------------------------------------


def _rows_compiled(name: str) -> Form:
    return _compiled(counter_dither.KERNELS[name])


def _rows_triton(name: str) -> Form:
    """The Triton form (:mod:`gradstat.theory.kernels.triton_dither`): compiled on CUDA, interpreted on a CPU."""
    return Form(counter_dither.triton_form(name), counter_dither.triton_form_applies(name))


def _native_quantize(out: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, key: torch.Tensor,
                     gain: float, lo: int, hi: int, shift: float, dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    return counter_native.quantize_rows_into(out, x, scale.reshape(-1), int(base), key, gain, lo, hi, shift)


def _native_quantize_applies(out: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, *_: Any) -> bool:
    return counter_native.quantizes(x, scale.reshape(-1).contiguous(), out.dtype) and scale.is_contiguous()


def _native_reconstruct(out: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                        key: torch.Tensor, gain: float, offset: float, subtract: bool) -> torch.Tensor:  # fmt: skip
    return counter_native.reconstruct_rows_into(out, codes, scale.reshape(-1), int(base), key, gain, offset, subtract)


def _native_reconstruct_applies(out: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, *_: Any) -> bool:
    return counter_native.reconstructs(codes, scale.reshape(-1)) and scale.is_contiguous() and out.is_contiguous()


def _native_sample(out: torch.Tensor, row_factor: torch.Tensor, base: torch.Tensor, key: torch.Tensor,
                   d: int) -> torch.Tensor:  # fmt: skip
    return counter_native.sample_indices_into(out, int(base), key, d)


def _native_sample_applies(out: torch.Tensor, *_: Any) -> bool:
    return counter_native.samples(out)


def _native_hashes_below(key: torch.Tensor, d: int, cut: int, expected: int = 0) -> torch.Tensor:
    return counter_native.hashes_below(d, cut, key, expected)


def _native_hashes_below_applies(key: torch.Tensor, *_: Any) -> bool:
    return key.device.type == "cpu" and native.extension() is not None


# -- NDQSG's nested rows (one row, first index 0: the form the C loops take) -------------------------------------------


def _native_nested(out: torch.Tensor, g: torch.Tensor, kappa: torch.Tensor, base: torch.Tensor, key: torch.Tensor,
                   alpha: float, delta1: float, k: int) -> torch.Tensor:  # fmt: skip
    return counter_native.nested_rows_into(out, g, float(kappa), key, alpha, delta1, k)


def _native_nested_applies(out: torch.Tensor, g: torch.Tensor, kappa: torch.Tensor, base: torch.Tensor,
                           key: torch.Tensor, alpha: float, delta1: float, k: int) -> bool:  # fmt: skip
    return g.shape[0] == 1 and int(base) == 0 and out.dtype == torch.int8 and counter_native.nests(g, k, delta1)


def _native_estimate(out: torch.Tensor, side: torch.Tensor, kappa: torch.Tensor, base: torch.Tensor,
                     key: torch.Tensor, alpha: float, delta1: float, k: int) -> torch.Tensor:  # fmt: skip
    codes = out.to(torch.int8)  # the reference holds the codes as float32 in ``out``; the C loop reads int8
    return counter_native.nested_estimate_into(out, codes, side, float(kappa), key, alpha, delta1, k)


def _native_estimate_applies(out: torch.Tensor, side: torch.Tensor, kappa: torch.Tensor, base: torch.Tensor,
                             key: torch.Tensor, alpha: float, delta1: float, k: int) -> bool:  # fmt: skip
    return out.shape[0] == 1 and int(base) == 0 and counter_native.nests(side, k, delta1) and out.is_contiguous()


LOG_MAGNITUDE = 120.0
"""A bound on |log z| for the logarithms of :func:`gradstat.theory.kernels.stage_stats.tail_moments`: z is a
nonzero float32 or float64 magnitude times a power-of-two unit near the vector's largest, so z > 2^-1100 and
|log z| < 763 in float64; in float32 z > 1e-45 and |log z| < 104. 120 covers float32 (the C loops' and
the compiled kernels' dtype for logs); float64 logs agree to an ulp of 763 times eps64, far inside it too."""


def _tail_bound(args: tuple[Any, ...], want: torch.Tensor) -> torch.Tensor:
    """Sums: 1e-12 relative (reordered float64 sums); the sum of logs: 2 ulps of each logarithm (``x``'s dtype) of
    at most :data:`LOG_MAGNITUDE`, over the count of used elements."""
    x = args[0]
    bound = want.abs() * 1e-12
    if want.numel() > 3:
        bound[3] = bound[3] + 2 * torch.finfo(x.dtype).eps * want[0] * LOG_MAGNITUDE
    return bound


def _summary_bound(args: tuple[Any, ...], want: torch.Tensor) -> torch.Tensor:
    """1e-12 relative (reordered float64 sums); the sum of logarithms (a seventh entry, with ``logs``) as in
    :func:`_tail_bound`, over the count of nonzero elements."""
    x = args[0]
    bound = want.abs() * 1e-12
    if want.numel() > 6:
        bound[6] = bound[6] + 2 * torch.finfo(x.dtype).eps * want[2] * LOG_MAGNITUDE
    return bound


def _fwht_bound(args: tuple[Any, ...], want: torch.Tensor) -> torch.Tensor:
    """Each output is a signed sum of the row's n inputs, summed in another order by each form: within
    n eps sum|x| of the row (the forward error of any order of summation; Higham, Accuracy and Stability, eq. (4.4))."""
    x = args[0]
    n = x.shape[-1]
    return (n * torch.finfo(x.dtype).eps * x.abs().sum(dim=-1, keepdim=True)).expand_as(want)


def _nested_kernel(i: int) -> Fused:
    return nested.NESTED_KERNELS[i]


KERNELS: dict[str, Kernel] = {
    k.name: k
    for k in (
        Kernel(
            "select",
            "selection: increasing indices of the nonzero |x| >= t (primitives.select_at_least)",
            primitives.select_at_least_reference,
            {
                "native": Form(_native_select, _native_select_applies),
                "numpy": Form(_numpy_select, _cpu_numpy),
                "compiled": Form(_compiled_select, lambda x, *_: compiler_for(x.device) and x.numel() >= 2),
                "eager": Form(_eager_policy(_blocked_select)),
                "triton": Form(_triton_select, _triton_exists),
            },
        ),
        Kernel(
            "select_bounded",
            "selection into buffers of fixed capacity, its count on the device (bounded.select_bounded)",
            bounded.reference,
            {"eager": Form(bounded.eager), "triton": Form(bounded.triton, bounded.triton_exists)},
        ),
        Kernel(
            "gather",
            "selection with the selected magnitudes (primitives.gather_at_least)",
            _gather_reference,
            {
                "native": Form(_native_gather, _native_select_applies),
                "numpy": Form(_numpy_gather, _cpu_numpy),
                "eager": Form(_eager_policy(primitives.gather_at_least)),
                "triton": Form(_triton_gather, _triton_exists),
            },
        ),
        Kernel(
            "summary",
            "stage statistics: min, max, nonzero count, sums of |x|, |x|^2 and log |x| (stage_stats.summary)",
            stage_stats.summary.reference,
            {
                "native": _native(stage_stats.summary),
                "compiled": _compiled(stage_stats.summary),
                "triton": Form(triton_stats.summary, triton_stats.exists),
            },
            bound=_summary_bound,
        ),
        Kernel(
            "tail_moments",
            "stage statistics over |x| > t: count, sums of z, z^2, log z (stage_stats.tail_moments)",
            stage_stats.tail_moments.reference,
            {
                "native": _native(stage_stats.tail_moments),
                "compiled": _compiled(stage_stats.tail_moments),
                "triton": Form(triton_stats.tail_moments, triton_stats.exists),
            },
            bound=_tail_bound,
        ),
        Kernel(
            "count_excess",
            "count and excess over |x| >= t (primitives.count_excess)",
            primitives.count_excess.reference,
            {
                "compiled": _compiled(primitives.count_excess),
                "triton": Form(primitives.count_excess_by_tails, triton_stats.exists),
            },
            rtol=1e-12,
        ),
        Kernel(
            "block_max",
            "row maxima of blocks (primitives.block_max)",
            primitives.block_max.reference,
            {"compiled": _compiled(primitives.block_max)},
        ),
        Kernel(
            "sign_split_sums",
            "1-bit SGD's class statistics (primitives.sign_split_sums)",
            primitives.sign_split_sums.reference,
            {"compiled": _compiled(primitives.sign_split_sums)},
            rtol=1e-12,
        ),
        Kernel(
            "quantize_rows",
            "dithered quantization of rows with the counter dither (counter_dither.quantize_rows_into)",
            counter_dither.KERNELS["quantize_rows_into"].reference,
            {
                "native": Form(_native_quantize, _native_quantize_applies),
                "compiled": _rows_compiled("quantize_rows_into"),
                "triton": _rows_triton("quantize_rows_into"),
            },
        ),
        Kernel(
            "reconstruct_rows",
            "reconstruction of dithered codes (counter_dither.reconstruct_rows_into)",
            counter_dither.KERNELS["reconstruct_rows_into"].reference,
            {
                "native": Form(_native_reconstruct, _native_reconstruct_applies),
                "compiled": _rows_compiled("reconstruct_rows_into"),
                "triton": _rows_triton("reconstruct_rows_into"),
            },
        ),
        Kernel(
            "signed_rows",
            "random signs of the counter hash times the rows (counter_dither.signed_rows_into)",
            counter_dither.KERNELS["signed_rows_into"].reference,
            {"compiled": _rows_compiled("signed_rows_into"), "triton": _rows_triton("signed_rows_into")},
        ),
        Kernel(
            "hash_keys",
            "2^31 - h of the counter hash in float32: a bounded random subset's keys (counter_dither.hash_keys_into)",
            counter_dither.KERNELS["hash_keys_into"].reference,
            {"compiled": _rows_compiled("hash_keys_into"), "triton": _rows_triton("hash_keys_into")},
        ),
        Kernel(
            "sample_indices",
            "indices drawn with replacement from the counter hash, floor((h + 2^31) d / 2^32): DGC's sample "
            "(counter_dither.sample_indices_into)",
            counter_dither.KERNELS["sample_indices_into"].reference,
            {
                "native": Form(_native_sample, _native_sample_applies),
                "compiled": _rows_compiled("sample_indices_into"),
                "triton": _rows_triton("sample_indices_into"),
            },
        ),
        Kernel(
            "hashes_below",
            "random-k's candidates on a CPU: the counters whose hash lies below a cut, as sort keys "
            "(counter_dither.hashes_below)",
            counter_dither.hashes_below,
            {"native": Form(_native_hashes_below, _native_hashes_below_applies)},
        ),
        Kernel(
            "nested_rows",
            "NDQSG's nested encode, eq. (6) (nested.nested_rows_into)",
            _nested_kernel(0).reference,
            {
                "native": Form(_native_nested, _native_nested_applies),
                "compiled": _compiled(_nested_kernel(0)),
                "triton": _rows_triton("nested_rows_into"),
            },
        ),
        Kernel(
            "nested_estimate",
            "NDQSG's decode with side information, eq. (7) (nested.nested_reconstruct_rows_in_place)",
            _nested_kernel(1).reference,
            {
                "native": Form(_native_estimate, _native_estimate_applies),
                "compiled": _compiled(_nested_kernel(1)),
                "triton": _rows_triton("nested_reconstruct_rows_in_place"),
            },
        ),
        Kernel(
            "gamma_halley",
            "the gamma quantile's Halley steps: x with P(a, x) = p or Q(a, x) = q (gamma_halley.halley)",
            gamma_halley.reference,
            {"triton": Form(triton_gamma.halley, _gamma_triton_exists)},
            rtol=2e-9,  # (each form within 1e-9 of scipy's inverse, by its own evaluation of P and Q: tests)
        ),
        Kernel(
            "fwht",
            "Walsh-Hadamard transform along the last dimension (hadamard.fwht)",
            hadamard.fwht_butterfly,
            {"matmul": Form(hadamard.fwht, lambda x: x.shape[-1] <= hadamard.MATMUL_ORDER)},
            bound=_fwht_bound,
        ),
    )
}
"""Every kernel by name."""


def native_built() -> bool:
    """Whether the C loops are installed here (they are optional: a build without a compiler skips them)."""
    return native.built()
