"""Gradient vectors the validation checks run on: synthetic (seeded) or taken from a gradient dump.

Most bounds are conditional on the gradient (``E[. | g] <= bound * ||g||^2``), so a check needs one fixed vector
(or a sequence of them over steps for error-feedback bounds) and averages only over the compressor's randomness.
:class:`GradientSource` supplies them:

- ``synthetic`` (default): i.i.d. entries with random signs and magnitudes from a sparsity-inducing law (SIDCo
  SIDCo (Abdelmoniem et al.) Sec. 2.3): ``exponential`` (a Laplace vector: double
  exponential, scale 1, the default; ``laplace`` and ``exp`` are accepted aliases), ``gamma`` (double
  gamma, shape 0.5), ``genpareto`` (double generalized Pareto, shape 0.25) or ``normal``, drawn with
  :mod:`gradstat.theory.distributions` from a generator seeded with ``seed``;
- ``dump``: a block of ``n`` consecutive coordinates of the flattened model gradient of a dump, at the position
  of largest l2 norm (so a dead layer never yields an all-zero block); sequences cycle through the dump's steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gradstat.theory.distributions.names import DISTRIBUTIONS, distribution_name


@dataclass
class GradientSource:
    """Where checks take their gradients from.

    Attributes
    ----------
    dump : an opened dump (``analysis.dumps.open_dump``) or None for synthetic vectors.
    steps : the dump steps to use (default: all).
    worker : the dump worker to read.
    seed : seed of the synthetic draws.
    """

    dump: Any = None
    steps: list[int] | None = None
    worker: int = 0
    seed: int = 1234
    family: str = "exponential"
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if str(self.family).strip().lower() == "normal":
            self.family = "normal"
        else:
            try:
                self.family = distribution_name(self.family, "synthetic family")
            except ValueError as exc:
                raise ValueError(f"{exc} or normal") from None

    @property
    def label(self) -> str:
        if self.dump is None:
            return f"synthetic {law_label(self.family)}"
        name = getattr(self.dump, "workload", None) or "dump"
        return f"dump {name} ({len(self._steps())} steps)"

    def _steps(self) -> list[int]:
        return list(self.steps) if self.steps else list(self.dump.steps)

    def _flat(self, step: int) -> torch.Tensor:
        key = ("flat", step)
        if key not in self._cache:
            self._cache[key] = self.dump.flat(step, worker=self.worker, device="cpu", dtype=torch.float64)
        return self._cache[key]

    def _offset(self, n: int) -> int:
        key = ("offset", n)
        if key not in self._cache:
            flat = self._flat(self._steps()[0])
            if flat.numel() < n:
                raise ValueError(f"the dump's gradient has {flat.numel()} elements, fewer than the block n={n}")
            sq = torch.nn.functional.pad(flat.square().cumsum(0), (1, 0))
            window = sq[n:] - sq[:-n]
            self._cache[key] = int(window.argmax())
        return self._cache[key]

    def block_origin(self, n: int, index: int = 0) -> tuple[int, int]:
        """(dump step, first coordinate) of the block :meth:`vector` returns for ``n`` and ``index`` (dump only)."""
        steps = self._steps()
        return steps[index % len(steps)], self._offset(n)

    def vector(
        self, n: int, device: torch.device | str = "cpu", index: int = 0, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """A fixed gradient block of length ``n`` (``index`` picks another synthetic draw / dump step)."""
        if n < 1:
            raise ValueError(f"vector length n must be >= 1, got {n}")
        if self.dump is None:
            x = _synthetic(self.family, n, torch.Generator().manual_seed(self.seed * 1_000_003 + index))
        else:
            steps = self._steps()
            off = self._offset(n)
            x = self._flat(steps[index % len(steps)])[off : off + n]
            if not bool(x.any()):
                x = self._flat(steps[0])[off : off + n]
        return x.to(device=device, dtype=dtype)

    def sequence(
        self, n: int, length: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> list[torch.Tensor]:
        """``length`` gradient blocks of length ``n`` over consecutive steps (cycling through a dump's steps)."""
        return [self.vector(n, device, index=i, dtype=dtype) for i in range(length)]


SYNTHETIC = (*DISTRIBUTIONS, "normal")

LAWS = {
    "exponential": "Laplace(1)",
    "gamma": "double gamma(shape 0.5, scale 1)",
    "genpareto": "double generalized Pareto(shape 0.25, scale 1)",
    "normal": "N(0, 1)",
}
"""The one naming table of the synthetic laws: what :func:`_synthetic` draws for each family, as every label
(validation rows, report sections, the mutation table) writes it."""


def law_label(family: str) -> str:
    """The readable law of a synthetic ``family`` (:data:`LAWS`); the family itself where it has no entry."""
    return LAWS.get(family, family)


def _synthetic(family: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """n i.i.d. float64 values with random signs and magnitudes of ``family`` (see the module docstring)."""
    if family == "normal":
        return torch.randn(n, generator=gen, dtype=torch.float64)
    import gradstat.theory.distributions as td

    dist = {
        "exponential": lambda: td.Exponential(scale=1.0),
        "gamma": lambda: td.Gamma(shape=0.5, scale=1.0),
        "genpareto": lambda: td.GenPareto(shape=0.25, scale=1.0),
    }[family]()
    mags = dist.sample(n, gen, device="cpu", dtype=torch.float64)
    signs = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int8).double() * 2 - 1
    return mags * signs
