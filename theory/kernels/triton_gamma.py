"""The gamma quantile's Halley steps as one Triton kernel: SIDCo's gamma threshold without a launch per operation.

:func:`gradstat.theory.distributions.incgamma.gammainccinv` solves Q(a, x) = q (or P(a, x) = p, on the smaller tail's
branch) for x by Halley steps in t = log x (SIDCo (Abdelmoniem et al.), Cor. 1.2 (14), App. B.3.1 (19)-(20)). In
torch each step is a dozen operations on one value and one serial evaluation of P or Q by torch's kernel (about
14 us on one thread of an H100 per value in the earlier GPU profile, and a second launch for the other function at
0): some 15 launches per step. Here one program runs every step for a block of values, each lane with its own
value:

- log P by its series, ``log P = a log x - x - log Gamma(a + 1) + log sum_n x^n / ((a + 1) ... (a + n))``, where
  x < a + 1, and log Q by its continued fraction (modified Lentz), ``log Q = a log x - x - log Gamma(a) + log h``,
  elsewhere (Numerical Recipes' ``gser`` and ``gcf``); the other tail as ``log(1 - e^{log tail})``, which keeps full
  precision there (the tail computed directly is the larger one, above about 0.3). Everything in logarithms: no
  tail underflows, so the torch solver's stand-in for an underflowed tail is not needed;
- each loop runs until every lane's term is below 1e-17 of its sum (at most :data:`MAX_TERMS`): about 25 terms
  at a = 1, 900 at a = 1e4;
- the step itself is the torch solver's: Newton's step divided by ``1 - h h'' / (2 h'^2)``, that correction
  clamped to [-1/2, 1/2], the step to [-2, 2], t kept above the bound ``(log p + log Gamma(a + 1)) / a``.

The start (the torch solver's guess, raised to the bound) and log Gamma(a), log Gamma(a + 1) come in computed by
torch; the result is x = e^t. It agrees with scipy's ``gammainccinv`` within the torch solver's tolerance (1e-9
relative; the tests hold it to that on the interpreter over a in [1e-3, 1e4] and q in [1e-300, 1 - 1e-16]), not
bit for bit with the torch solver (another evaluation of P and Q). Compiled functions call it as an operator
(:data:`HALLEY_OP`).
"""

from __future__ import annotations

from typing import Any

import torch

from gradstat.theory.kernels import policy, triton_runtime

tl: Any = None
"""``triton.language``, bound by :func:`gradstat.theory.kernels.triton_runtime.build`."""

BLOCK = 16
"""Values per program (SIDCo solves one)."""
MAX_TERMS = 1 << 18
"""Most terms of a series or continued fraction per evaluation: the series near x = a takes about sqrt(78 a) terms
(25 at a = 1, 900 at a = 1e4), so shapes up to about 8.8e8 converge; beyond, the value comes out NaN (never a
number cut short)."""
GRAPH_DEVICES = ("cuda",)
"""Device types on which a function torch.compile builds calls the kernel as its operator (:data:`HALLEY_OP`);
tests add ``cpu`` to run that path through Triton's interpreter."""


def _halley(  # type: ignore[no-untyped-def]
    a_ptr, logp_ptr, logq_ptr, lgam_ptr, lgam1_ptr, t_ptr, out_ptr, n, STEPS: tl.constexpr, MAX_TERMS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    a = tl.load(a_ptr + offsets, mask=inside, other=1.0)
    logp = tl.load(logp_ptr + offsets, mask=inside, other=-0.6931471805599453)
    logq = tl.load(logq_ptr + offsets, mask=inside, other=-0.6931471805599453)
    lgam = tl.load(lgam_ptr + offsets, mask=inside, other=0.0)
    lgam1 = tl.load(lgam1_ptr + offsets, mask=inside, other=0.0)
    t = tl.load(t_ptr + offsets, mask=inside, other=0.0)
    lower = logp < logq  # solve log P = log p when p < 1/2, else log Q = log q
    target = tl.where(lower, logp, logq)
    floor = (logp + lgam1) / a
    one = tl.full((BLOCK,), 1.0, tl.float64)
    zero = tl.full((BLOCK,), 0.0, tl.float64)
    tiny = tl.full((BLOCK,), 1e-300, tl.float64)  # (float64 constants: a bare literal is float32)
    eps = tl.full((BLOCK,), 1e-17, tl.float64)  # a term below this fraction of its sum ends a loop
    cut = tl.full((BLOCK,), 0, tl.int32)  # lanes whose series or fraction stopped at MAX_TERMS unconverged
    for _ in range(STEPS):
        x = tl.exp(t)
        series = x < a + 1.0
        # log P by its series where x < a + 1: sum = 1 + x/(a+1) + x^2/((a+1)(a+2)) + ...
        term = tl.where(series, one, zero)
        total = one
        ap = a
        k = 0
        while (tl.reduce(tl.where(term > eps * total, 1, 0), 0, tl.standard._elementwise_max) > 0) & (k < MAX_TERMS):
            ap = ap + 1.0
            term = tl.where(term > eps * total, term * x / ap, zero)
            total = total + term
            k += 1
        cut = cut | tl.where(term > eps * total, 1, 0)
        log_p_series = tl.log(total) + a * t - x - lgam1
        # log Q by its continued fraction where x >= a + 1 (modified Lentz)
        b = x + 1.0 - a
        c = tl.full((BLOCK,), 1e300, tl.float64)
        d = one / tl.where(tl.abs(b) < tiny, tiny, b)
        h = d
        change = tl.where(series, zero, one)
        i = 0
        while (tl.reduce(tl.where(change > eps, 1, 0), 0, tl.standard._elementwise_max) > 0) & (i < MAX_TERMS):
            i += 1
            an = -i * (i - a)
            b = b + 2.0
            d = an * d + b
            d = one / tl.where(tl.abs(d) < tiny, tiny, d)
            c = b + an / c
            c = tl.where(tl.abs(c) < tiny, tiny, c)
            ratio = d * c
            h = tl.where(change > eps, h * ratio, h)
            change = tl.where(change > eps, tl.abs(ratio - 1.0), zero)
        cut = cut | tl.where(change > eps, 1, 0)
        log_q_fraction = tl.log(tl.where(series, one, h)) + a * t - x - lgam  # (h < 0 on series lanes: unused)
        # the branch's tail; the other one as log(1 - e^{log tail}) (its series below 1e-4: log1p's precision)
        direct = tl.where(series, log_p_series, log_q_fraction)
        y = tl.exp(direct)
        kept = tl.maximum(one - y, tiny, propagate_nan=tl.PropagateNan.ALL)
        other = tl.where(y < 1e-4, -y * (one + y * (0.5 + y / 3.0)), tl.log(kept))
        log_tail = tl.where(lower == series, direct, other)
        # h = log_tail - target; h' = +-exp(a t - x - lgamma(a) - log_tail); h'' = h' (a - x - h')
        slope = tl.exp(a * t - x - lgam - log_tail)
        slope = tl.where(lower, slope, -slope)
        residual = log_tail - target
        correction = residual * (a - x - slope) / (2.0 * slope)
        correction = tl.where(tl.abs(correction) < float("inf"), correction, zero)  # (NaN and infinities: 0)
        correction = tl.minimum(tl.maximum(correction, -0.5), 0.5)
        step = residual / slope / (one - correction)
        step = tl.where(step == step, tl.minimum(tl.maximum(step, -2.0), 2.0), zero)  # (clamped, then NaN: 0)
        t = tl.maximum(t - step, floor, propagate_nan=tl.PropagateNan.ALL)  # (a NaN stays NaN, as in torch)
    tl.store(out_ptr + offsets, tl.where(cut > 0, float("nan"), tl.exp(t)), mask=inside)


_BROKEN = triton_runtime.Fallback("the Triton gamma quantile", policy.ENV)
"""Set once the kernel has failed in this process (reported once; the torch solver runs from then on)."""


def runs_on(a: torch.Tensor) -> bool:
    """Whether the quantile of ``a``'s values runs by this kernel: float64 values on CUDA, Triton installed, the
    policy not ``never``, the kernel not failed in this process."""
    return (
        a.device.type == "cuda"
        and a.dtype == torch.float64
        and policy.native_allowed()
        and not _BROKEN.is_set()
        and triton_runtime.available()
    )


def in_graph(a: torch.Tensor) -> bool:
    """Whether a compiled function calls :data:`HALLEY_OP` on ``a`` (read while torch.compile traces: plain
    attributes only): float64 values on a device of :data:`GRAPH_DEVICES`, the operator registered and not failed."""
    return a.device.type in GRAPH_DEVICES and a.dtype == torch.float64 and HALLEY_OP is not None and not _BROKEN.failed


def halley(
    a: torch.Tensor,
    logp: torch.Tensor,
    logq: torch.Tensor,
    lgam: torch.Tensor,
    lgam1: torch.Tensor,
    start: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """x after ``steps`` Halley steps from ``t = start`` (log x) for each value: same-shaped float64 tensors on one
    device (compiled on CUDA, interpreted on a CPU). Raises what Triton raises where it cannot build or launch it."""
    kernel = triton_runtime.build(_halley, interpret=a.device.type == "cpu")
    flat = [v.detach().reshape(-1).contiguous() for v in (a, logp, logq, lgam, lgam1, start)]
    out = torch.empty_like(flat[0])
    n = out.numel()
    if n == 0:
        return out.reshape(a.shape)
    context, options = triton_runtime.launch(flat[0])
    with context:
        kernel[(-(-n // BLOCK),)](*flat, out, n, STEPS=steps, MAX_TERMS=MAX_TERMS, BLOCK=BLOCK, **options)
    return out.reshape(a.shape)


def report(exc: Exception) -> None:
    """Record the kernel's failure (one RuntimeWarning per process); the torch solver runs from then on."""
    _BROKEN.report(exc)


def _halley_op(
    a: torch.Tensor,
    logp: torch.Tensor,
    logq: torch.Tensor,
    lgam: torch.Tensor,
    lgam1: torch.Tensor,
    start: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    try:
        return halley(a, logp, logq, lgam, lgam1, start, steps)
    except Exception as exc:  # noqa: BLE001  (reported once, the reference answers; raised again in a CUDA capture)
        report(exc)
        from gradstat.theory.kernels import gamma_halley  # (imported here: it imports this module)

        return gamma_halley.reference(a, logp, logq, lgam, lgam1, start, steps)


def _halley_fake(
    a: torch.Tensor,
    logp: torch.Tensor,
    logq: torch.Tensor,
    lgam: torch.Tensor,
    lgam1: torch.Tensor,
    start: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)  # (contiguous, as halley's output)


def _register() -> Any:
    """:func:`halley` as the operator ``gradstat::gamma_halley``, opaque to torch.compile (None where this torch has
    no ``custom_op``, Triton is not installed, or the name is taken)."""
    custom_op = getattr(torch.library, "custom_op", None)
    if custom_op is None or not triton_runtime.available():
        return None
    try:
        op = custom_op("gradstat::gamma_halley", mutates_args=())(_halley_op)
        op.register_fake(_halley_fake)
    except Exception:  # noqa: BLE001  (compiled functions then trace the torch solver, as before)
        return None
    return op


HALLEY_OP = _register()
