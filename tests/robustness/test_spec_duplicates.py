"""A compressor spec names each parameter once: a repeated key is an error, never a silent last-one-wins."""

from __future__ import annotations

import pytest

from gradstat.compressors.registry import create, parse_spec


def test_duplicate_key_is_an_error_naming_the_key_and_both_values() -> None:
    with pytest.raises(ValueError, match=r"duplicate parameter 'ratio'.*ratio=0.01 and ratio=0.5"):
        parse_spec("topk:ratio=0.01,ratio=0.5")


def test_duplicate_key_with_spaces_is_the_same_key() -> None:
    with pytest.raises(ValueError, match="duplicate parameter 'ratio'"):
        create("topk:ratio=0.01, ratio =0.01")


def test_distinct_keys_still_parse() -> None:
    assert parse_spec("qcs:k=64,Q=4") == ("qcs", {"k": "64", "Q": "4"})
