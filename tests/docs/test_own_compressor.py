"""The "Add your own compressor" page, followed as written: its example compressor (``docs/examples/
my_compressor.py``) registers, passes every test of the generic battery (``tests/compressors/test_battery.py``)
that applies to it, counts its bits exactly, runs as a DDP hook on 2 ranks (``my_ddp.py``) and its validation check
(``my_check.py``) holds; a planted bug (rounding always up) is caught by the battery and by the check."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
from pathlib import Path

import pytest
import torch

from gradstat.compressors import Context, Payload, registry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
BATTERY = ROOT / "tests" / "compressors" / "test_battery.py"


def _load(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example(request):
    """The example modules importable by name (as the page runs them), with ``natural`` registered for this
    module's tests only."""
    sys.path.insert(0, str(EXAMPLES))
    import my_compressor

    yield my_compressor
    registry._REGISTRY.pop("natural", None)
    for name in ("my_compressor", "my_check", "my_ddp"):
        sys.modules.pop(name, None)
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def battery(example):
    yield _load("battery_for_docs", BATTERY)
    sys.modules.pop("battery_for_docs", None)


def battery_cases(battery):
    """``(test function, keyword arguments)`` for every battery test that takes a compressor ``name`` and is
    parametrized over every registered compressor, with each combination of its other parameters (CPU)."""
    for fname, fn in inspect.getmembers(battery, inspect.isfunction):
        if not fname.startswith("test_") or "name" not in inspect.signature(fn).parameters:
            continue
        marks = {m.args[0]: m.args[1] for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"}
        if list(marks.get("name", [])) != list(battery.NAMES):
            continue  # a test over a subset (e.g. compressors with a ratio) does not apply to an unknown member
        others = {k: v for k, v in marks.items() if k != "name"}
        for values in itertools.product(*others.values()):
            kwargs = dict(zip(others, values, strict=True))
            if "device" in inspect.signature(fn).parameters:
                kwargs["device"] = torch.device("cpu")
            yield fn, kwargs


def test_the_example_registers_under_its_name(example):
    assert registry.get("natural") is example.NaturalCompression
    assert registry.create("natural").spec() == "natural"


# --8<-- [start:battery]
def test_the_example_passes_the_generic_battery(battery):
    ran = []
    for fn, kwargs in battery_cases(battery):
        fn(name="natural", **kwargs)
        ran.append(fn.__name__)
    assert "test_declared_unbiasedness_or_contraction_holds" in ran and "test_shape_and_dtype_preserved" in ran
    assert len(set(ran)) >= 8, f"only {sorted(set(ran))} of the battery applied"


# --8<-- [end:battery]


# --8<-- [start:bits]
@pytest.mark.parametrize("dtype, width", [(torch.float32, 9), (torch.float16, 6), (torch.float64, 12)])
def test_the_bits_are_one_sign_bit_and_one_exponent_code_per_element_plus_the_seed(example, dtype, width):
    """Counted by hand: 2^-149 .. 2^127 and zero are 278 float32 codes (9 bits); 2^-24 .. 2^15 and zero are 41
    float16 codes (6 bits); 2^-1074 .. 2^1023 and zero are 2099 float64 codes (12 bits); the seed is 64 bits."""
    g = torch.randn(1000, dtype=dtype)
    payload = registry.create("natural").encode(g, Context(seed=1))
    assert payload.bits == 64 + 1000 * (1 + width)
    wire = payload.to_bytes()
    assert wire.numel() == payload.wire_bytes == 12 + 28 * 3 + -(-payload.bits // 8)  # header: 3 parts
    back = Payload.from_bytes(wire, g.shape, g.dtype)
    c = registry.create("natural")
    assert torch.equal(c.decode(back, Context(seed=1)), c.decode(payload, Context(seed=1)))


# --8<-- [end:bits]


def test_the_extremes_of_each_dtype_decode_to_finite_powers_of_two(example):
    c = registry.create("natural")
    x = torch.tensor([3e38, -1e-45, 0.0, 1.5, -0.75])
    out = c(x, Context(seed=2))
    assert torch.isfinite(out).all() and out[2] == 0 and out[0] == 2.0**127 and out[1] == -(2.0**-149)
    assert torch.equal(torch.frexp(out[3:])[0].abs(), torch.full((2,), 0.5))
    half = c(torch.tensor([65000.0, -(2.0**-24)], dtype=torch.float16), Context(seed=3))
    assert half.tolist() == [2.0**15, -(2.0**-24)]


def test_the_ddp_hook_trains_on_two_ranks_with_the_counted_bits(ddp_examples):
    params = 32 * 4 + 4  # nn.Linear(32, 4): one bucket
    for rank in ddp_examples["rows"]:
        rows = rank["my_ddp"]
        assert [r["bits"] for r in rows] == [64 + params * 10] * 3
        assert all(r["sent_bytes"] > 0 and torch.isfinite(torch.tensor(r["loss"])) for r in rows)


def test_the_validation_check_holds(example):
    from my_check import NATURAL_VARIANCE

    result = NATURAL_VARIANCE.run("quick", seed=0)
    assert result.verdict == "holds", result.row()


# --8<-- [start:planted]
def test_a_planted_bug_fails_the_battery_and_the_check(example, battery, monkeypatch):
    """Always rounding up (the uniforms replaced by 0) is biased and breaks the 1/8 bound."""
    from my_check import NATURAL_VARIANCE

    monkeypatch.setattr(
        example, "dither_rows", lambda rows, size, base, key, device: torch.full((rows, size), -0.5, device=device)
    )
    assert battery.check_unbiased(registry.create("natural"))
    assert NATURAL_VARIANCE.run("quick", seed=0).verdict == "violated"


# --8<-- [end:planted]
