"""Hadamard matrices and the fast Walsh-Hadamard transform used by QCS's randomized mixing.

QCS (Abdi & Fekri), eq. (1)-(2) and Sec. 6) mixes each gradient block with k rows of an n x n Hadamard
matrix H_n (entries +-1, ``H H^T = n I``). The paper uses block sizes that are powers of two or one of
{96, 100, 192, 200, 288, 320, 384}, built "using Sylvester's, Paley's or Williamson's construction". Here:

- n = 2^a: Sylvester's matrix, applied by the fast Walsh-Hadamard transform (O(n log n), no dense matmul);
- n = m 2^a with a Paley base of order m: ``H_n = P_m kron S_{2^a}``. The Paley base is
  Paley I, order q + 1 for a prime power q = 3 (mod 4), or Paley II, order 2 (q + 1) for q = 1 (mod 4), over GF(p)
  or GF(p^2). The smallest such m is used, so the dense part is an m x m matmul on small m
  (96 = 12 x 8, 100 = Paley II over GF(49), 192 = 12 x 16, 200 = 100 x 2, 288 = 36 x 8, 320 = 20 x 16,
  384 = 12 x 32).

All transforms act on the last dimension of a batch ``(..., n)`` of any floating dtype and device.
"""

from __future__ import annotations

import functools

import torch


def is_power_of_two(n: int) -> bool:
    """True for n = 1, 2, 4, 8, ..."""
    return n >= 1 and n & (n - 1) == 0


MATMUL_ORDER = 256
"""Up to this order the transform is one matrix product with the cached Sylvester matrix: a BLAS product reads the
data once and stays in cache per row block, where log2(n) butterfly passes each write a fresh full-size tensor
(measured ~10x faster on one CPU thread for n = 64 and 256)."""


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized fast Walsh-Hadamard transform ``x @ S_n`` along the last dimension (Sylvester order).

    Parameters
    ----------
    x : tensor of shape (..., n), n a power of two, floating dtype, any device.

    Returns
    -------
    Tensor of the same shape: ``S_n x`` for each row, where ``S_1 = [1]``, ``S_2n = [[S_n, S_n], [S_n, -S_n]]``
    (symmetric, so this is also ``S_n^T x``). For n <= :data:`MATMUL_ORDER` one product with ``S_n`` (equal to
    :func:`fwht_butterfly` within float rounding: the sums are ordered differently), else log2(n) butterfly passes.
    """
    n = x.shape[-1]
    if not is_power_of_two(n):
        raise ValueError(f"fwht: the last dimension must be a power of two, got {n}")
    if n > MATMUL_ORDER:
        return fwht_butterfly(x)
    return x @ _sylvester_on(n, x.dtype, x.device)


@functools.lru_cache(maxsize=None)  # (never evicted: a captured CUDA graph reads it by address)
def _sylvester_on(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    s = torch.ones(1, 1, dtype=dtype, device=device)
    while s.shape[0] < n:
        s = torch.cat((torch.cat((s, s), 1), torch.cat((s, -s), 1)), 0)
    return s


def fwht_butterfly(x: torch.Tensor) -> torch.Tensor:
    """Reference form of :func:`fwht`: log2(n) butterfly passes of O(n) each."""
    n = x.shape[-1]
    if not is_power_of_two(n):
        raise ValueError(f"fwht: the last dimension must be a power of two, got {n}")
    batch = x.shape[:-1]
    y = x.reshape(-1, n)
    h = 1
    while h < n:
        y = y.view(-1, n // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(*batch, n)


# -- finite fields GF(p) and GF(p^2) for the Paley constructions -------------------------------------------------
def _prime_power(q: int) -> tuple[int, int] | None:
    """(p, e) with q = p^e for a prime p, or None."""
    if q < 2:
        return None
    p = next(d for d in range(2, q + 1) if q % d == 0)
    e = 0
    while q % p == 0:
        q //= p
        e += 1
    return (p, e) if q == 1 else None


def _quadratic_character(q: int) -> list[list[int]]:
    """Jacobsthal matrix Q_ij = chi(x_i - x_j) over GF(q), q = p or p^2 with p an odd prime.

    Elements of GF(p^2) are a + b*theta with theta^2 = c, c the smallest quadratic non-residue mod p.
    """
    pe = _prime_power(q)
    if pe is None or pe[0] == 2 or pe[1] > 2:
        raise ValueError(f"Paley construction implemented for GF(p) and GF(p^2), p odd prime; got q={q}")
    p, e = pe
    if e == 1:
        elems = [(a, 0) for a in range(p)]
        c = 0
    else:
        residues = {(a * a) % p for a in range(1, p)}
        c = next(a for a in range(2, p) if a not in residues)
        elems = [(a, b) for a in range(p) for b in range(p)]

    def mul(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
        return ((x[0] * y[0] + c * x[1] * y[1]) % p, (x[0] * y[1] + x[1] * y[0]) % p)

    squares = {mul(x, x) for x in elems if x != (0, 0)}

    def chi(x: tuple[int, int]) -> int:
        return 0 if x == (0, 0) else (1 if x in squares else -1)

    return [[chi(((xi[0] - xj[0]) % p, (xi[1] - xj[1]) % p)) for xj in elems] for xi in elems]


def _paley(m: int) -> torch.Tensor | None:
    """A Paley Hadamard matrix of order m (int8), or None when neither Paley I nor II gives order m."""
    pe1 = _prime_power(m - 1)
    if pe1 is not None and (m - 1) % 4 == 3 and pe1[1] <= 2:  # Paley I
        q = m - 1
        jac = torch.tensor(_quadratic_character(q), dtype=torch.int64)
        s = torch.zeros(m, m, dtype=torch.int64)  # skew conference matrix [[0, j^T], [-j, Q]]
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jac
        return (torch.eye(m, dtype=torch.int64) + s).to(torch.int8)
    if m % 2 == 0:  # Paley II
        q = m // 2 - 1
        pe = _prime_power(q)
        if pe and q % 4 == 1 and pe[1] <= 2:
            jac = torch.tensor(_quadratic_character(q), dtype=torch.int64)
            c = torch.zeros(q + 1, q + 1, dtype=torch.int64)  # symmetric conference matrix [[0, j^T], [j, Q]]
            c[0, 1:], c[1:, 0], c[1:, 1:] = 1, 1, jac
            zero_block = torch.tensor([[1, -1], [-1, -1]])
            one_block = torch.tensor([[1, 1], [1, -1]])
            h = torch.kron(c, one_block) + torch.kron((c == 0).long(), zero_block)
            return h.to(torch.int8)
    return None


@functools.lru_cache(maxsize=256)
def factor(n: int) -> tuple[int, int]:
    """Split a supported order as n = m * 2^a with m = 1 (pure Sylvester) or the smallest Paley base order m.

    Raises
    ------
    ValueError if no such split exists (the message names the supported sizes).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"Hadamard order must be a positive integer, got {n!r}")
    if is_power_of_two(n):
        return 1, n
    p2 = n & -n  # largest power of two dividing n
    # the smallest base first: m = n / 2^a for the largest 2^a that leaves a Paley order
    while p2 >= 1:
        m = n // p2
        if m > 2 and _base(m) is not None:
            return m, p2
        p2 //= 2
    raise ValueError(
        f"no Hadamard matrix of order {n} is constructed here: supported orders are powers of two and "
        f"m * 2^a with m a Paley order (q + 1, q = 3 mod 4, or 2(q + 1), q = 1 mod 4, q = p or p^2), "
        f"which covers the QCS paper's 96, 100, 192, 200, 288, 320, 384"
    )


@functools.lru_cache(maxsize=256)
def _base(m: int) -> torch.Tensor | None:
    """The Paley matrix of order m, built once (None when there is none)."""
    return _paley(m)


def _factored_base(m: int) -> torch.Tensor:
    """The Paley base of an order m > 1 returned by :func:`factor` (which only returns orders that have one)."""
    base = _base(m)
    if base is None:
        raise ValueError(f"no Paley Hadamard matrix of order {m}")
    return base


@functools.lru_cache(maxsize=None)  # (never evicted: a captured CUDA graph reads it by address)
def _base_on(m: int, dtype: torch.dtype, device: torch.device, transpose: bool) -> torch.Tensor:
    """The Paley base as a dense matrix of ``dtype`` on ``device`` (copied there once, not on every call)."""
    base = _factored_base(m).to(dtype=dtype, device=device)
    return base.T.contiguous() if transpose else base


def is_supported(n: int) -> bool:
    """True when :func:`hadamard_matrix` and :func:`hadamard_transform` accept order n."""
    try:
        factor(n)
    except ValueError:
        return False
    return True


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The dense n x n Hadamard matrix whose action :func:`hadamard_transform` computes (for tests and small n).

    Returns ``P_m kron S_{n/m}`` (see the module docstring), entries +-1, with ``H H^T = n I``.
    """
    m, p2 = factor(n)
    s = torch.ones(1, 1, dtype=torch.int64)
    while s.shape[0] < p2:
        s = torch.cat((torch.cat((s, s), 1), torch.cat((s, -s), 1)), 0)
    h = s if m == 1 else torch.kron(_factored_base(m).long(), s)
    return h.to(dtype=dtype, device=device)


def hadamard_transform(x: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """``H_n x`` (or ``H_n^T x``) along the last dimension of ``x`` of shape (..., n), without forming H_n.

    For n = m 2^a, ``(P_m kron S) x`` reshapes each row to (m, 2^a), applies the fast transform to the 2^a axis and
    the small m x m Paley matrix to the m axis. Cost O(n (log n + m)).
    """
    n = x.shape[-1]
    m, p2 = factor(n)
    if m == 1:
        return fwht(x)
    batch = x.shape[:-1]
    y = fwht(x.reshape(*batch, m, p2))
    base = _base_on(m, x.dtype, x.device, transpose)
    z = y.movedim(-2, 0)  # (m, ..., p2): one 2-D matmul on all rows
    z = (base @ z.reshape(m, -1)).reshape(z.shape)
    return z.movedim(0, -2).reshape(*batch, n)


@functools.lru_cache(maxsize=None)  # (never evicted: a captured CUDA graph reads it by address)
def _first_row_on(m: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """First row of the base of order m (all ones for Sylvester, m = 1) on ``device``."""
    if m == 1:
        return torch.ones(1, dtype=dtype, device=device)
    return _factored_base(m)[0].to(dtype=dtype, device=device)


def _folds(n: int, k: int) -> bool:
    """True when the first k rows of H_n = P_m kron S_p2 are ``P_m[0] kron [S_k, ..., S_k]`` (k | p2)."""
    m, p2 = factor(n)
    return is_power_of_two(k) and k <= p2 and p2 % k == 0


def first_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """The first k entries of ``H_n x`` along the last dimension: (..., n) -> (..., k).

    When k is a power of two dividing the Sylvester factor 2^a of n, the first k rows of ``P_m kron S_{2^a}`` are
    ``P_m[0] kron [S_k S_k ... S_k]``, so the n/k chunks of x are summed (with the signs of the base's first row)
    and one k-point fast transform is applied: O(n + k log k) instead of O(n log n). Otherwise the full transform.
    """
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"first_rows: k must lie in [1, n={n}], got {k}")
    if not _folds(n, k):
        return hadamard_transform(x)[..., :k]
    m, p2 = factor(n)
    chunks = x.reshape(*x.shape[:-1], m, p2 // k, k)
    if m > 1:  # a Sylvester order's first row is all ones: multiplying by it is the identity, bit for bit
        chunks = chunks * _first_row_on(m, x.dtype, x.device)[:, None, None]
    return fwht(chunks.sum(dim=(-3, -2)))


def first_rows_transpose(v: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``H_n[:k]^T v`` along the last dimension: (..., k) -> (..., n), the adjoint of :func:`first_rows`; written
    into ``out`` (contiguous, shape (..., n), v's dtype) when given, with the same values."""
    k = v.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"first_rows_transpose: k={k} must lie in [1, n={n}]")
    if out is None:
        out = v.new_empty(*v.shape[:-1], n)
    if not _folds(n, k):
        padded = v.new_zeros(*v.shape[:-1], n)
        padded[..., :k] = v
        return out.copy_(hadamard_transform(padded, transpose=True))
    m, p2 = factor(n)
    sign = _first_row_on(m, v.dtype, v.device)
    w = fwht(v)[..., None, None, :] * sign[:, None, None]  # (..., m, 1, k)
    out.view(*v.shape[:-1], m, p2 // k, k).copy_(w.expand(*v.shape[:-1], m, p2 // k, k))
    return out
