"""The generic battery: every registered compressor, built with ``create(name)`` and its defaults, is held to the
contract and to the properties it declares (like scipy.stats' ``test_continuous_basic``). A compressor is tested
the moment it is registered.

Checks (each is a function returning a list of problems, so the last tests below can show that it fails on a
deliberately broken compressor):
- shape and dtype preserved (float32, float16, bfloat16; flat and 2-D);
- a separately constructed decoder (a fresh ``create(spec)``) reproduces the reconstruction bit for bit;
- no global RNG state is read (same output under different global seeds) or changed;
- declared-unbiased: Monte Carlo z-test of the mean error projected on 4 fixed directions, Bonferroni, 99.9 %;
- declared contraction ``E||C(g) - g||^2 <= c ||g||^2``: per draw when the constant holds for every draw,
  else the 99.9 % lower confidence limit of the Monte Carlo mean must not exceed the bound;
- degenerate input: empty, NaN, Inf give a ValueError/TypeError; size 1, constant, all zeros, half zeros and
  d < 1/delta give either a ValueError or a finite result of the right shape (zeros decode to zeros), within
  a timeout (never a hang); a ``ratio`` outside (0, 1) is rejected at construction.
Compressors that need side information (``needs_side``) are decoded with the exact gradient as side information.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist

import pytest
import torch
from _hang import run_with_timeout

from gradstat import compressors
from gradstat.compressors import registry
from gradstat.compressors.base import Compressor, Properties
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers.randk import RandK
from gradstat.compressors.wire.payload import Payload, float_width

NAMES = compressors.names()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TIMEOUT_S = 30.0

MC_DIM = 8192  # Monte Carlo checks: vector length,
MC_TRIALS = 600  # number of independent draws (seeds),
MC_CONFIDENCE = 0.999  # overall confidence of each Monte Carlo verdict.


# -- helpers ------------------------------------------------------------------------------------------------
def laplace(d: int, seed: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    u = torch.rand(d, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).to(device=device, dtype=dtype)


def roundtrip(c: Compressor, g: torch.Tensor, ctx: Context) -> tuple[Payload, torch.Tensor]:
    ctx = ctx.but(state=c.new_state(g))
    payload = c.encode(g, ctx)
    side = g if c.properties.needs_side else None
    return payload, c.decode(payload, ctx, side=side)


def z_critical(tests: int, confidence: float = MC_CONFIDENCE) -> float:
    """Two-sided Bonferroni critical value for ``tests`` simultaneous z-tests at overall ``confidence``."""
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / (2 * tests))


def contraction_constant(c: Compressor, g: torch.Tensor, out: torch.Tensor) -> tuple[float, bool]:
    """The declared contraction constant for this draw, and whether it must hold for every draw (True) or only
    in expectation (False). Unknown declarations fail loudly: the battery must learn every claim it is given."""
    claim = c.properties.contraction
    d = g.numel()
    if claim == "1 - k_hat/d":  # keeps the k_hat largest magnitudes: holds draw by draw
        return 1.0 - int((out != 0).sum()) / d, True
    if claim == "1 - delta":  # Top-k for every draw, Random-k in expectation
        return 1.0 - float(c.ratio), not c.properties.randomized
    if claim == "1 - 1/d":  # scaled sign (EF-signSGD)
        return 1.0 - 1.0 / d, True
    if claim == "1 - 1/m":  # one reconstruction pair per group of m elements (1-bit SGD)
        rows, cols = c.matrix_shape(g.shape)
        return 1.0 - 1.0 / (rows if c.axis == "column" else cols), True
    raise AssertionError(
        f"{c.name}: the battery does not know how to check contraction {claim!r}; add it to contraction_constant()"
    )


# -- the checks -------------------------------------------------------------------------------------------
def check_unbiased(c: Compressor, trials: int = MC_TRIALS, d: int = MC_DIM) -> list[str]:
    """z-test that E[C(g)] = g: the mean error projected on g and on 3 fixed Gaussian directions is 0."""
    g = laplace(d, seed=11)
    gen = torch.Generator().manual_seed(12)
    directions = torch.cat([g[None] / g.norm(), torch.randn(3, d, generator=gen, dtype=torch.float64).float()])
    proj = torch.empty(trials, directions.shape[0], dtype=torch.float64)
    for t in range(trials):
        _, out = roundtrip(c, g, Context(seed=1000 + t, step=t))
        proj[t] = (directions @ (out.float() - g)).double()
    mean, se = proj.mean(0), proj.std(0) / math.sqrt(trials)
    z = mean / torch.where(se > 0, se, torch.ones_like(se))
    crit = z_critical(directions.shape[0])
    bad = (z.abs() > crit) | ((se == 0) & (mean.abs() > 1e-6 * g.norm().double()))
    return [
        f"{c.name}: mean error along direction {i} is {mean[i]:.4g} (z = {z[i]:.2f}, |z| > {crit:.2f}): biased"
        for i in torch.nonzero(bad).flatten().tolist()
    ]


def check_contraction(c: Compressor, trials: int = 200, d: int = MC_DIM) -> list[str]:
    """The declared contraction holds: for every draw when it is a per-draw claim (float slack 1e-5; 50 draws of
    a randomized compressor), else the one-sided 99.9 % lower confidence limit of the Monte Carlo mean of
    ``trials`` draws stays below the bound."""
    problems = []
    for name, g in (
        ("laplace", laplace(d, seed=21)),
        ("constant", torch.full((d,), 0.5)),
        ("half zeros", laplace(d, seed=22) * (torch.arange(d) % 2)),
    ):
        energy = float((g.double() ** 2).sum())
        errors, bounds, draws, t = [], [], 1, 0
        while t < draws:
            _, out = roundtrip(c, g, Context(seed=2000 + t, step=t))
            bound, per_draw = contraction_constant(c, g, out)
            errors.append(float(((out.double() - g.double()) ** 2).sum()) / energy)
            bounds.append(bound)
            if c.properties.randomized:
                draws = 50 if per_draw else trials
            t += 1
        if per_draw:
            worst = max(range(len(errors)), key=lambda i: errors[i] - bounds[i])
            if errors[worst] > bounds[worst] + 1e-5:
                problems.append(
                    f"{c.name} on {name}: ||C(g)-g||^2/||g||^2 = {errors[worst]:.6f} > "
                    f"{c.properties.contraction} = {bounds[worst]:.6f}"
                )
        else:
            e = torch.tensor(errors, dtype=torch.float64)
            low = float(e.mean() - NormalDist().inv_cdf(MC_CONFIDENCE) * e.std() / math.sqrt(len(errors)))
            if low > max(bounds) + 1e-9:
                problems.append(
                    f"{c.name} on {name}: mean ||C(g)-g||^2/||g||^2 >= {low:.6f} (99.9 % lower limit) "
                    f"> {c.properties.contraction} = {max(bounds):.6f}"
                )
    return problems


def check_reproducible_decoder(c: Compressor, g: torch.Tensor) -> list[str]:
    """A fresh compressor built from ``c.spec()`` decodes the payload to exactly the same tensor."""
    ctx = Context(seed=5, step=3, worker=1, block=2)
    payload, out = roundtrip(c, g, ctx)
    other = registry.create(c.spec())
    again = other.decode(payload, ctx, side=g if c.properties.needs_side else None)
    if not torch.equal(out, again):
        return [f"{c.name}: a separately built decoder differs by up to {float((out - again).abs().max()):.3g}"]
    return []


def check_no_global_rng(c: Compressor, g: torch.Tensor) -> list[str]:
    """Encode+decode neither changes nor depends on the global torch RNG."""
    problems, outs = [], []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        before = torch.random.get_rng_state()
        cuda_before = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        outs.append(roundtrip(c, g, Context(seed=7))[1])
        if not torch.equal(before, torch.random.get_rng_state()):
            problems.append(f"{c.name}: the global CPU RNG state was changed")
        if cuda_before is not None and any(
            not torch.equal(a, b) for a, b in zip(cuda_before, torch.cuda.get_rng_state_all(), strict=True)
        ):
            problems.append(f"{c.name}: the global CUDA RNG state was changed")
    if not torch.equal(outs[0], outs[1]):
        problems.append(f"{c.name}: the output depends on the global RNG seed")
    return problems


# -- the battery over every registered compressor ---------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shape_and_dtype_preserved(name, dtype, device):
    c = compressors.create(name)
    for shape in [(1000,), (8, 257)]:
        g = laplace(math.prod(shape), seed=1, device=device, dtype=dtype).reshape(shape)
        payload, out = roundtrip(c, g, Context(seed=3))
        assert out.shape == g.shape and out.dtype == g.dtype and out.device == g.device
        assert bool(torch.isfinite(out).all())
        assert isinstance(payload.bits, int) and payload.bits > 0


@pytest.mark.parametrize("name", NAMES)
def test_a_gradient_that_requires_grad_is_compressed_like_its_values(name, device):
    """A tensor still attached to autograd (a parameter's .grad under create_graph, a hook's input): the payload
    and the reconstruction equal those of its detached values, and nothing is recorded for autograd."""
    c = compressors.create(name)
    g = laplace(2000, seed=5, device=device)
    attached = g.clone().requires_grad_(True)
    plain, attached_payload = c.encode(g, Context(seed=2)), c.encode(attached, Context(seed=2))
    assert attached_payload.bits == plain.bits
    out = c.decode(attached_payload, Context(seed=2), side=g if c.properties.needs_side else None)
    want = c.decode(plain, Context(seed=2), side=g if c.properties.needs_side else None)
    assert torch.equal(out, want) and not out.requires_grad


@pytest.mark.parametrize("name", NAMES)
def test_named_tensors_are_compressed_per_layer_and_decoded_back(name, device):
    c = compressors.create(name)
    if c.properties.needs_side:
        pytest.skip(f"{name} decodes with side information, which encode_named/decode_named do not carry")
    grads = {"conv.weight": laplace(16 * 3 * 5 * 5, 1, device).reshape(16, 3, 5, 5), "fc.bias": laplace(512, 2, device)}
    payloads = compressors.encode_named(c, grads, Context(seed=4))
    decoded = compressors.decode_named(compressors.create(c.spec()), payloads, Context(seed=4))
    for key, g in grads.items():
        assert decoded[key].shape == g.shape
        block = list(grads).index(key)
        assert torch.equal(
            decoded[key], c.decode(c.encode(g, Context(seed=4, block=block)), Context(seed=4, block=block))
        )


@pytest.mark.parametrize("name", NAMES)
def test_separate_decoder_reproduces_the_reconstruction(name, device):
    c = compressors.create(name)
    for d in (1000, 4099):
        assert check_reproducible_decoder(c, laplace(d, seed=d, device=device)) == []


@pytest.mark.parametrize("name", NAMES)
def test_no_global_rng_state_is_read_or_changed(name, device):
    assert check_no_global_rng(compressors.create(name), laplace(3000, seed=4, device=device)) == []


@pytest.mark.parametrize("name", NAMES)
def test_declared_unbiasedness_or_contraction_holds(name):
    c = compressors.create(name)
    if c.properties.unbiased:
        assert check_unbiased(c) == []
    if c.properties.contraction is not None:
        assert check_contraction(c) == []
    if not c.properties.unbiased and c.properties.contraction is None:
        pytest.skip(
            f"{name} declares neither unbiasedness nor a contraction (its bound "
            f"{c.properties.bound!r} is checked by its own tests)"
        )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", ["empty", "nan", "inf", "integer"])
def test_invalid_input_is_rejected_clearly(name, bad, device):
    c = compressors.create(name)
    g = {
        "empty": torch.zeros(0, device=device),
        "integer": torch.arange(500, device=device),
        "nan": laplace(500, 1, device).index_fill(0, torch.tensor([3], device=device), math.nan),
        "inf": laplace(500, 1, device).index_fill(0, torch.tensor([3], device=device), -math.inf),
    }[bad]
    with pytest.raises((ValueError, TypeError)) as err:
        run_with_timeout(lambda: roundtrip(c, g, Context()), TIMEOUT_S)
    assert c.name in str(err.value) or "gradient" in str(err.value) or "tensor" in str(err.value)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", ["size1", "short", "constant", "zeros", "half_zeros", "tiny", "huge"])
def test_degenerate_input_gives_an_error_or_a_correct_result(name, case, device):
    c = compressors.create(name)
    g = {
        "size1": torch.tensor([0.7]),
        "short": laplace(37, 5),
        "constant": torch.full((1000,), -0.25),
        "zeros": torch.zeros(1000),
        "half_zeros": laplace(1000, 6) * (torch.arange(1000) < 500),
        "tiny": laplace(1000, 7) * 1e-30,
        "huge": laplace(1000, 8) * 1e30,
    }[case].to(device)

    def attempt():
        try:
            return roundtrip(c, g, Context(seed=9))[1]
        except ValueError as exc:  # a clear refusal is a correct answer
            assert str(exc), "a ValueError must say what is wrong"
            return None

    out = run_with_timeout(attempt, TIMEOUT_S)
    if out is None:
        return
    assert out.shape == g.shape and out.dtype == g.dtype
    assert bool(torch.isfinite(out).all()), f"{name} returned NaN/Inf on {case} input"
    if case == "zeros":
        assert not bool(out.any()), f"{name} decodes an all-zero gradient to something nonzero"


@pytest.mark.parametrize(
    "name", [n for n in NAMES if "ratio" in {f.name for f in dataclasses.fields(compressors.get(n))}]
)
@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.5, -0.1, math.nan])
def test_ratio_outside_the_open_unit_interval_is_rejected(name, ratio):
    with pytest.raises(ValueError, match="ratio"):
        compressors.create(name, ratio=ratio)


@pytest.mark.parametrize("name", NAMES)
def test_spec_string_rebuilds_an_equal_compressor(name):
    c = compressors.create(name)
    assert registry.create(c.spec()) == c


# -- the battery detects broken compressors --------------------------------------------------------------------
@dataclass
class _ScaledRandK(RandK):
    """Random-k scaled by 1.05 d/k while claiming to be unbiased: 5 % biased (expected z about 4.6 at the battery's
    Monte Carlo size, against the 99.9 % Bonferroni limit 3.66)."""

    properties = Properties(kind="sparsifier", unbiased=True, randomized=True)

    def _encode(self, g, payload, ctx):
        super()._encode(g * (1.05 * g.numel() / math.ceil(self.ratio * g.numel())), payload, ctx)


@dataclass
class _BottomK(Compressor):
    """Sends the k smallest magnitudes while claiming the threshold contraction 1 - k_hat/d."""

    ratio: float = 0.01
    properties = Properties(kind="sparsifier", unbiased=False, randomized=False, contraction="1 - k_hat/d")

    def _encode(self, g, payload, ctx):
        idx = torch.topk(g.abs(), math.ceil(self.ratio * g.numel()), largest=False).indices
        payload.add("indices", idx, 32, "index")
        payload.add("values", g[idx], float_width(torch.float32), "value")

    def _decode(self, payload, ctx, side):
        return torch.zeros(payload.numel).index_put_((payload["indices"],), payload["values"])


@dataclass
class _GlobalRandK(RandK):
    """Random-k drawing its indices from the global RNG: not reproducible by a separate decoder."""

    def _encode(self, g, payload, ctx):
        k = math.ceil(self.ratio * g.numel())
        idx = torch.randperm(g.numel())[:k]
        payload.add("indices", idx, 32, "index")
        payload.add("values", g[idx], 32, "value")

    def _check_payload(self, payload):
        return None  # sends no seed (RandK's decode would refuse the payload before its draw could be seen)

    def _decode(self, payload, ctx, side):
        idx = torch.randperm(payload.numel)[: payload["values"].numel()]
        return torch.zeros(payload.numel).index_put_((idx,), payload["values"])


@pytest.fixture
def broken():
    """Register test-only broken compressors for one test, then remove them from the registry."""
    added = {"_test_scaled_randk": _ScaledRandK, "_test_bottomk": _BottomK, "_test_global_randk": _GlobalRandK}
    for n, cls in added.items():
        registry.register(n)(cls)
    yield {n: registry.create(n) for n in added}
    for n in added:
        registry._REGISTRY.pop(n, None)


def test_battery_detects_a_biased_compressor(broken):
    problems = check_unbiased(broken["_test_scaled_randk"])
    assert problems and "biased" in problems[0]


def test_battery_detects_a_violated_contraction(broken):
    assert check_contraction(broken["_test_bottomk"])


def test_battery_detects_global_rng_use(broken):
    g = laplace(3000, seed=4)
    assert check_no_global_rng(broken["_test_global_randk"], g)
    assert check_reproducible_decoder(broken["_test_global_randk"], g)


def test_broken_compressors_are_gone_after_the_test():
    assert not any(n.startswith("_test_") for n in compressors.names())
