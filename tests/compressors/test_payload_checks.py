"""What ``Payload.from_bytes`` and ``decode`` refuse, each with a PayloadError naming the part at fault."""

from __future__ import annotations

import math

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.payload import HEADER_PREFIX_BYTES, PART_DESCRIPTOR_BYTES, Payload

D = 1000


def _g() -> torch.Tensor:
    return torch.randn(D, generator=torch.Generator().manual_seed(0))


def _topk() -> tuple[compressors.Compressor, Payload]:
    c = compressors.create("topk:ratio=0.01")
    return c, c.encode(_g())


def _sent(payload: Payload, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``payload`` with part ``name`` holding ``tensor`` (same width and kind)."""
    part = payload.parts[name]
    payload.parts[name] = part.__class__(tensor, part.width, part.kind)
    return payload.to_bytes()


def _read(data: torch.Tensor) -> Payload:
    return Payload.from_bytes(data, torch.Size([D]), torch.float32)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_value_is_refused_where_the_bytes_are_read(value):
    _, p = _topk()
    values = p["values"].clone()
    values[3] = value
    with pytest.raises(PayloadError, match="finite") as err:
        _read(_sent(p, "values", values))
    assert err.value.part == "values"


@pytest.mark.parametrize("index", [D, 1023])
def test_an_index_past_the_tensor_is_refused_where_the_bytes_are_read(index):
    _, p = _topk()
    indices = p["indices"].clone()
    indices[0] = index
    with pytest.raises(PayloadError, match=r"indices in \[0, 1000\)") as err:
        _read(_sent(p, "indices", indices))
    assert err.value.part == "indices"


def test_a_payload_read_for_another_shape_is_refused_by_decode():
    c = compressors.create("dqsg")
    back = Payload.from_bytes(c.encode(_g()).to_bytes(), torch.Size([D + 1]), torch.float32)  # well-formed bytes
    with pytest.raises(PayloadError, match="1000 elements where 1001 are expected") as err:
        c.decode(back)
    assert err.value.part == "codes"


def test_a_missing_part_is_a_payload_error_and_still_a_key_error():
    c, p = _topk()
    del p.parts["values"]
    with pytest.raises(PayloadError, match="no part 'values'") as err:
        c.decode(p)
    assert isinstance(err.value, KeyError) and str(err.value).startswith("payload has no part")


def test_values_and_indices_of_different_lengths_are_refused():
    c, p = _topk()
    p.parts["values"] = p.parts["values"].__class__(p["values"][:-1], 32, "value")
    with pytest.raises(PayloadError, match="holds 9 elements where 10 are expected") as err:
        c.decode(p)
    assert err.value.part == "values"


@pytest.mark.parametrize(
    "field,offset,raw,match",
    [
        ("kind", 8, bytes([200]), "kind 200"),
        ("dtype", 9, bytes([77]), "dtype 77"),
        ("width", 10, bytes([33]), "widths above 32"),
        ("ndim", 11, bytes([3]), "3 dimensions"),
        ("name", 0, b"\xff", "not printable ASCII"),
        ("bias", 20, (2**63 - 1).to_bytes(8, "little"), "bias"),
    ],
)
def test_a_corrupt_descriptor_field_is_named(field, offset, raw, match):
    _, p = _topk()
    data = p.to_bytes().clone()
    at = HEADER_PREFIX_BYTES + offset  # the first part's descriptor (indices)
    data[at : at + len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    with pytest.raises(PayloadError, match=match):
        _read(data)
    assert PART_DESCRIPTOR_BYTES == 28


def test_a_scale_that_overflows_once_decoded_is_refused():
    c = compressors.create("dqsg")
    p = c.encode(_g())
    biggest = torch.finfo(torch.float32).max
    p.parts["scales"] = p.parts["scales"].__class__(torch.full_like(p["scales"], biggest), 32, "scale")
    top = torch.full_like(p["codes"], int(p["codes"].max()))  # every code at the outermost level
    p.parts["codes"] = p.parts["codes"].__class__(top, p.parts["codes"].width, "code")
    back = _read(p.to_bytes())  # finite scales, codes in range: well-formed bytes whose reconstruction overflows
    with pytest.raises(PayloadError, match="NaN/Inf"):
        c.decode(back, Context())


def test_a_sound_payload_still_decodes_exactly():
    c, p = _topk()
    assert torch.equal(c.decode(_read(p.to_bytes())), c.decode(p))
