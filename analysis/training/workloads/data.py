"""Offline data for the built-in workloads: scikit-learn's digits (shipped with the package) and a text corpus
shipped with Python itself. Nothing is downloaded; everything is deterministic."""

from __future__ import annotations

import codecs
import functools
import hashlib
import importlib.util
import re

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=4)
def digits(size: int = 28, channels: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1,797 handwritten 8x8 digits, bilinearly upsampled to ``size`` x ``size``, repeated over
    ``channels`` and standardised to zero mean, unit variance.

    Returns
    -------
    images : float32 tensor of shape (1797, channels, size, size), CPU.
    labels : int64 tensor of shape (1797,), classes 0..9.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = (x - x.mean()) / x.std()
    return x.repeat(1, channels, 1, 1).contiguous(), torch.tensor(bunch.target, dtype=torch.int64)


@functools.lru_cache(maxsize=1)
def zen_of_python() -> str:
    """The Zen of Python (PEP 20), decoded from the source of the stdlib module ``this`` without importing it
    (importing prints it). The text has been stable across Python 3 releases."""
    spec = importlib.util.find_spec("this")
    if spec is None or spec.origin is None:
        raise OSError("the standard-library module 'this' is not available; the lstm workload needs its text")
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    match = re.search(r's = """(.*?)"""', source, re.S)
    if match is None:
        raise OSError(f"{spec.origin}: could not find the encoded text of the Zen of Python")
    return codecs.decode(match.group(1), "rot13")


def corpus_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def char_windows(text: str, length: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Every window of ``length + 1`` consecutive characters of ``text`` as (inputs, next-character targets).

    Returns
    -------
    inputs, targets : int64 tensors of shape (len(text) - length, length).
    vocabulary : the sorted distinct characters (index = code).
    """
    vocab = sorted(set(text))
    codes = torch.tensor([vocab.index(c) for c in text], dtype=torch.int64)
    windows = codes.unfold(0, length + 1, 1)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), vocab
