"""Planted bugs: for every validation check, realistic mistakes in the code it checks, applied by patching that
code for the duration of one run. A check *kills* a mutation when its verdict turns to ``violated``; a check that
cannot fail is not a check.

Each :class:`Mutation` names its check, what the bug is (in the words of a code review: wrong constant, dither not
subtracted or doubled, wrong scale, off-by-one k, wrong sign, side information scaled, ...) and a ``patch`` that
returns the context managers planting it. :func:`kill_table` runs them all (quick Monte Carlo sizes, seed 0,
synthetic Laplace vectors) and :func:`write_kill_table` writes the Markdown table with the kill rate; a mutation
that survives keeps its ``why`` (the reason the check cannot see it) in the table.

The checks run the compressors at their defaults, so the bugs go where those run: the dithered quantizers'
counter-dither forms (``counter_dither.quantize_rows`` and ``reconstruct_rows``, NDQSG's ``nested_index`` and
``nested_estimate``, QCS's counter ``signs``), eagerly. The ``dither=torch`` forms have planted-bug tests of their
own (``tests/compressors/test_dqsg.py``).

Run ``python -m gradstat.analysis.validation.mutations --out reports/mutations.md`` to regenerate the table; the
test suite (``tests/validation/test_mutations.py``) runs every mutation.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator
from unittest import mock

import pandas as pd
import torch

from gradstat.analysis.measure.tables import atomic_write_text, to_markdown
from gradstat.analysis.measure.verdicts import Size
from gradstat.analysis.validation import registry

if TYPE_CHECKING:
    from gradstat.compressors.schemes.quantizers.qcs import QCS


@dataclass(frozen=True)
class Mutation:
    """A planted bug: ``check`` must turn ``violated`` while ``patch()``'s context managers are active; ``why``
    explains a known survivor (empty when the check must kill it) and ``caught_by`` names the companion check
    whose mutation of the same name kills the same bug (empty when none does)."""

    check: str
    name: str
    bug: str
    patch: Callable[[], list]
    why: str = ""
    caught_by: str = ""


@contextlib.contextmanager
def planted(m: Mutation) -> Iterator[None]:
    """Apply ``m``'s patches for the duration of the block."""
    with contextlib.ExitStack() as stack:
        for cm in m.patch():
            stack.enter_context(cm)
        yield


# -- patches: each returns a list of mock.patch context managers ------------------------------------------------
def _qcs_alpha(value: Callable[[QCS], float]) -> list:
    from gradstat.compressors.schemes.quantizers.qcs import QCS

    return [mock.patch.object(QCS, "reconstruction_scale", value)]


def _eager() -> contextlib.AbstractContextManager[None]:
    """The fused kernels off for the mutation's run: a patched function then runs at once, where a compiled
    kernel would first be rebuilt (dynamo recompiles on a changed global) at seconds per variant."""
    from gradstat.theory.fused import forced

    return forced("never")


def _counter_quantize(dither_gain: float) -> object:
    """The counter dither's quantization step (``counter_dither.quantize_rows``, restated with one change) with
    the dither scaled by ``dither_gain``: the encoder's bug. The decoder's dither stays right."""
    import gradstat.compressors.kernels.counter_dither as cd

    def quantize_rows(x, scale, base, key, gain, lo, hi, shift, dtype):  # noqa: ANN001, ANN202
        u = cd.dither_rows(x.shape[0], x.shape[1], base, key, x.device) * dither_gain
        return torch.floor(x / scale * gain + u + shift).clamp(lo, hi).to(dtype)

    return mock.patch.object(cd, "quantize_rows", quantize_rows)


def _dither_not_subtracted() -> list:
    import gradstat.compressors.kernels.counter_dither as cd

    rows = cd.reconstruct_rows
    return [
        _eager(),
        mock.patch.object(cd, "reconstruct_rows", lambda c, s, b, k, g, o, subtract: rows(c, s, b, k, g, o, False)),
    ]


def _dither_scaled(factor: float) -> list:
    return [_eager(), _counter_quantize(factor)]


def _dither_doubled() -> list:
    return _dither_scaled(2.0)


def _no_dither() -> list:
    return _dither_scaled(0.0)


def _levels_off_by_one_at_decoder() -> list:
    """The receiver divides the scale by L + 1 instead of L (codes -L..L read as -(L+1)..L+1 levels)."""
    from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer

    orig = ScaledQuantizer.decode

    def decode(self, payload, d, seed):
        return orig(self, payload, d, seed) * (self.levels / (self.levels + 1))

    return [mock.patch.object(ScaledQuantizer, "decode", decode)]


def _scale_squared() -> list:
    """The encoder sends ||x||^2 as the bucket scale instead of ||x||."""
    import gradstat.compressors.schemes.quantizers.dither as dither

    state = {"encoding": False}
    enc = dither.ScaledQuantizer.encode

    def encode(self, x, payload, seed, *args, **kwargs):
        state["encoding"] = True
        try:
            return enc(self, x, payload, seed, *args, **kwargs)
        finally:
            state["encoding"] = False

    def add(payload_add):
        def wrapped(self, name, tensor, *a, **k):
            if name == "scales" and state["encoding"]:
                tensor = tensor * tensor  # the codes use the right scale, the scale sent is squared
            return payload_add(self, name, tensor, *a, **k)

        return wrapped

    from gradstat.compressors.wire.payload import Payload

    return [
        mock.patch.object(dither.ScaledQuantizer, "encode", encode),
        mock.patch.object(Payload, "add", add(Payload.add)),
    ]


def _mix_scale(factor: Callable[[int, int], float]) -> list:
    import gradstat.compressors.schemes.quantizers.qcs as qcs

    orig = qcs.mix
    return [mock.patch.object(qcs, "mix", lambda blocks, r, k: orig(blocks, r, k) * factor(blocks.shape[-1], k))]


def _signs_01() -> list:
    import gradstat.compressors.schemes.quantizers.qcs as qcs

    orig = qcs.signs
    return [mock.patch.object(qcs, "signs", lambda shape, seed, device: (orig(shape, seed, device) + 1) / 2)]


def _topk_encode(k_of: Callable[[int, int], int], largest: bool = True, sign: float = 1.0) -> list:
    from gradstat.compressors.schemes.sparsifiers.threshold import add_sparse
    from gradstat.compressors.schemes.sparsifiers.topk import TopK

    def encode(self, g, payload, ctx):
        d = g.numel()
        k = k_of(math.ceil(self.ratio * d), d)
        add_sparse(payload, sign * g, torch.topk(g.abs(), k, largest=largest, sorted=False).indices, self.packed)

    return [mock.patch.object(TopK, "_encode", encode)]


def _randk(k_shift: int = 0, scaled: bool = False) -> list:
    """Random-k whose encoder draws ``k + k_shift`` indices (the decoder follows the count it receives)."""
    import gradstat.compressors.schemes.sparsifiers.randk as randk

    def encode(self, g, payload, ctx):
        d = g.numel()
        k = math.ceil(self.ratio * d) + k_shift
        values = g[randk.random_subset(d, k, ctx.call_seed, g.device)]
        payload.add("values", (values * (d / k) if scaled else values).float(), 32, "value")
        payload.add_seed(ctx.call_seed)

    return [mock.patch.object(randk.RandK, "_encode", encode)]


def _wangni_probabilities(transform: Callable[[torch.Tensor], torch.Tensor]) -> list:
    import gradstat.compressors.schemes.sparsifiers.wangni as wangni

    orig = wangni.optimal_probabilities
    return [mock.patch.object(wangni, "optimal_probabilities", lambda a, k: transform(orig(a, k)))]


def _wangni_energy() -> list:
    import gradstat.compressors.schemes.sparsifiers.wangni as wangni

    orig = wangni.optimal_probabilities
    return [mock.patch.object(wangni, "optimal_probabilities", lambda a, k: orig(a * a, k))]


def _randk_fixed() -> list:
    import gradstat.compressors.schemes.sparsifiers.randk as randk

    orig = randk.random_subset
    return [mock.patch.object(randk, "random_subset", lambda d, k, seed, dev: orig(d, k, 0, dev))]


def _randk_largest() -> list:
    import gradstat.compressors.schemes.sparsifiers.randk as randk

    def encode(self, g, payload, ctx):
        k = math.ceil(self.ratio * g.numel())
        idx = torch.topk(g.abs(), k).indices
        payload.add("values", g[idx].float(), 32, "value")
        payload.add("indices", idx.int(), 32, "index")
        payload.add_seed(ctx.call_seed)

    def decode(self, payload, ctx, side):
        out = torch.zeros(payload.numel, dtype=torch.float32)
        return out.index_put_((payload["indices"].long(),), payload["values"])

    return [mock.patch.object(randk.RandK, "_encode", encode), mock.patch.object(randk.RandK, "_decode", decode)]


def _qcs_signs_wrong_seed() -> list:
    import gradstat.compressors.schemes.quantizers.qcs as qcs

    def decode(self, payload, ctx, side):
        seed = payload.seed
        rows = math.ceil(payload.numel / self.block)
        v_hat = self._quantizer().decode(payload, rows * self.k, seed).reshape(rows, self.k)
        r = self._signs_reference((rows, self.block), seed + 1, v_hat.device)  # the bug: seed + 1
        return (self.reconstruction_scale() * qcs.unmix(v_hat, r)).reshape(-1)[: payload.numel]

    return [mock.patch.object(qcs.QCS, "_decode", decode)]


def _wangni_not_rescaled() -> list:
    import gradstat.compressors.schemes.sparsifiers.wangni as wangni

    def encode(self, g, payload, ctx):
        d = g.numel()
        p = wangni.optimal_probabilities(g.abs(), math.ceil(self.ratio * d))
        u = torch.rand(d, generator=wangni.generator(ctx.call_seed, g.device), device=g.device, dtype=g.dtype)
        wangni.add_sparse(payload, g, torch.nonzero(u < p).squeeze(1), self.packed)  # g, not g / p

    return [mock.patch.object(wangni.Wangni, "_encode", encode)]


def _nested(encode_u: float = 1.0, decode_u: float = 1.0, side: float = 1.0, k_shift: int = 0) -> list:
    import gradstat.compressors.schemes.quantizers.ndqsg as nd

    index, estimate = nd.nested_index, nd.nested_estimate  # the nested worker's arithmetic, run eagerly
    return [
        _eager(),
        mock.patch.object(nd, "nested_index", lambda x, u, d1, k, a=1.0: index(x, encode_u * u, d1, k, a)),
        mock.patch.object(
            nd,
            "nested_estimate",
            lambda s, u, y, d1, k, a=1.0: estimate(s, decode_u * u, side * y, d1, k + k_shift, a),
        ),
    ]


def _tail_quantile(change: Callable) -> list:
    import gradstat.theory.thresholds as th

    orig = th.tail_quantile
    return [
        mock.patch.object(
            th, "tail_quantile", lambda dist, params, tail, q="exact": change(orig, dist, params, tail, q)
        )
    ]


def _scaled_params(orig, dist, params, tail, q):
    return orig(dist, {**params, "scale": params["scale"] * 1.05}, tail, q)


def _gmc_round(variant: str) -> list:
    """GMC's round with one line wrong (see :meth:`GlobalMomentumCompression.round`)."""
    from gradstat.compressors.memory.feedback import ErrorFeedback
    from gradstat.compressors.memory.momentum import GlobalMomentumCompression
    from gradstat.compressors.memory.send import feedback_round

    def round_(self, grads, states, shared, ctx=None):
        p = len(grads)
        last = shared.last_update
        div = 1 if variant == "no-1/p" else p
        sign = -1.0 if variant == "momentum-sign" else 1.0
        g = [
            x.float() / div if last is None else x.float() / div - sign * (self.momentum / (p * self.lr)) * last
            for x in grads
        ]
        feedback = ErrorFeedback(1.0, 1.0) if variant == "memory-kept" else ErrorFeedback.plain()
        result = feedback_round(self.compressor, feedback, g, states, ctx)
        update = -self.lr * torch.stack([d.float() for d in result.decoded]).sum(0)
        if variant == "double-momentum" and last is not None:
            update = update + self.momentum * last
        shared.last_update = update
        result.info = {"update": update}
        return result

    return [mock.patch.object(GlobalMomentumCompression, "round", round_)]


def _memory_never_cleared() -> list:
    """Error feedback stores z instead of z - C(z) (the sent coordinates are not removed from memory)."""
    from gradstat.compressors.memory.feedback import ErrorFeedback

    orig = ErrorFeedback.update

    def update(self, z, z_hat, state):
        orig(self, z, torch.zeros_like(z_hat), state)

    return [mock.patch.object(ErrorFeedback, "update", update)]


def _error_doubled() -> list:
    """Error feedback adds 2 (z - C(z)) to the memory (wrong constant)."""
    from gradstat.compressors.memory.feedback import ErrorFeedback

    orig = ErrorFeedback.update

    def update(self, z, z_hat, state):
        orig(self, 2 * z.float() - z_hat.float(), z_hat, state)

    return [mock.patch.object(ErrorFeedback, "update", update)]


def _feedback(make: Callable[[float], tuple[float, float]]) -> list:
    from gradstat.compressors.memory.feedback import ErrorFeedback

    return [mock.patch.object(ErrorFeedback, "qcs", classmethod(lambda cls, beta: cls(*make(beta))))]


def _residual_sign_flipped() -> list:
    from gradstat.compressors.memory.feedback import ErrorFeedback

    orig = ErrorFeedback.update

    def update(self, z, z_hat, state):
        orig(self, z_hat, z, state)  # h <- decay h + (z_hat - z)

    return [mock.patch.object(ErrorFeedback, "update", update)]


# -- the catalogue ------------------------------------------------------------------------------------------------
def _alpha(v: float) -> Callable[[], list]:
    return lambda: _qcs_alpha(lambda self: v)


_MMSE_1_OVER_GAMMA = lambda: _qcs_alpha(lambda self: 1.0 if self.alpha == "unbiased" else 1.0 / self.gamma)  # noqa: E731
_MMSE_AS_UNBIASED = lambda: _qcs_alpha(lambda self: 1.0)  # noqa: E731
_QCS_GAMMA_WHY = (
    "at k = 64 of n = 256, 3 of gamma's 3.26 is the sketching term n/k - 1; the quantization part is under 0.3 of "
    "it, so a bug that doubles or shrinks the quantization error moves E||e||^2 by less than the bound's slack"
)
_SIGN_WHY = (
    "an upper bound on the residual's norm cannot see its sign: r <- (1 - beta) r - e stays bounded (it is smaller)"
)
_RANDK_WHY = (
    "one coordinate of d = 1000 moves E = 1 - k/d by 0.001, a third of the 99 % interval's half-width at 300 "
    "trials; the same bug in Top-k's k is caught by topk-best-k, in GMC's random masks by gmc-cr-exact"
)
_CHEBYSHEV_WHY = "Theorem 6's Chebyshev bound is 30-100x the failure rate: a reported row, not a test"
_GMC_MEMORY_WHY = "Theorem 9's bound is 10^4-10^5 x the memory: no realistic bug reaches it"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("qcs-gamma", "alpha-1.1", "wrong constant: decoder scales by alpha = 1.1 instead of 1", _alpha(1.1)),
    Mutation("qcs-gamma", "signs-seed+1", "decoder regenerates the signs r from the wrong seed", _qcs_signs_wrong_seed),
    Mutation(
        "qcs-gamma",
        "dither-kept",
        "dither not subtracted at the decoder",
        _dither_not_subtracted,
        _QCS_GAMMA_WHY,
        "qcs-dither-exact",
    ),
    Mutation(
        "qcs-gamma",
        "dither-doubled",
        "dither doubled at the encoder",
        _dither_doubled,
        _QCS_GAMMA_WHY,
        "qcs-dither-exact",
    ),
    Mutation(
        "qcs-gamma",
        "levels+1",
        "wrong scale: receiver divides by Q + 1 levels",
        _levels_off_by_one_at_decoder,
        _QCS_GAMMA_WHY,
        "qcs-dither-exact",
    ),
    Mutation("qcs-dither-exact", "dither-kept", "dither not subtracted at the decoder", _dither_not_subtracted),
    Mutation("qcs-dither-exact", "dither-doubled", "dither doubled at the encoder", _dither_doubled),
    Mutation(
        "qcs-dither-exact", "alpha-1.1", "wrong constant: decoder scales by alpha = 1.1 instead of 1", _alpha(1.1)
    ),
    Mutation(
        "qcs-dither-exact", "levels+1", "wrong scale: receiver divides by Q + 1 levels", _levels_off_by_one_at_decoder
    ),
    Mutation(
        "qcs-mmse", "alpha-1/gamma", "wrong constant: MMSE alpha = 1/gamma instead of 1/(gamma+1)", _MMSE_1_OVER_GAMMA
    ),
    Mutation("qcs-mmse", "alpha-1", "MMSE scale forgotten (alpha = 1)", _MMSE_AS_UNBIASED),
    Mutation(
        "qcs-mmse",
        "dither-kept",
        "dither not subtracted at the decoder",
        _dither_not_subtracted,
        _QCS_GAMMA_WHY,
        "qcs-dither-exact",
    ),
    Mutation("qcs-unbiased", "alpha-1.1", "wrong constant: alpha = 1.1", _alpha(1.1)),
    Mutation(
        "qcs-unbiased", "levels+1", "wrong scale: receiver divides by Q + 1 levels", _levels_off_by_one_at_decoder
    ),
    Mutation(
        "qcs-lemma1",
        "sqrt-n",
        "wrong scale: mixing normalised by sqrt(n) instead of sqrt(k)",
        lambda: _mix_scale(lambda n, k: math.sqrt(k / n)),
    ),
    Mutation("qcs-lemma1", "signs-01", "Rademacher signs drawn in {0, 1} instead of {-1, +1}", _signs_01),
    Mutation("dqsg-exact", "dither-kept", "dither not subtracted at the decoder", _dither_not_subtracted),
    Mutation("dqsg-exact", "dither-doubled", "dither doubled at the encoder", _dither_doubled),
    Mutation("dqsg-exact", "scale-squared", "wrong scale: ||g||_inf^2 sent as the scale", _scale_squared),
    Mutation("half-dither-exact", "no-dither", "deterministic rounding (dither forgotten at the encoder)", _no_dither),
    Mutation("half-dither-exact", "dither-doubled", "dither doubled at the encoder", _dither_doubled),
    Mutation(
        "half-dither-exact", "levels+1", "wrong scale: receiver divides by M + 1 levels", _levels_off_by_one_at_decoder
    ),
    Mutation("qsgd-bound", "scale-squared", "wrong scale: ||x||^2 sent as the bucket scale", _scale_squared),
    Mutation("qsgd-bound", "dither-doubled", "dither doubled at the encoder", _dither_doubled),
    Mutation(
        "topk-contraction",
        "bottom-k",
        "keeps the k smallest magnitudes",
        lambda: _topk_encode(lambda k, d: k, largest=False),
    ),
    Mutation(
        "topk-contraction",
        "wrong-sign",
        "wrong sign: sends -g on the support",
        lambda: _topk_encode(lambda k, d: k, sign=-1.0),
    ),
    Mutation(
        "topk-contraction",
        "k-percent",
        "wrong constant: k = ratio d / 100 (ratio read as a percentage)",
        lambda: _topk_encode(lambda k, d: max(1, k // 100)),
    ),
    Mutation("topk-best-k", "k-1", "off-by-one k: keeps k - 1", lambda: _topk_encode(lambda k, d: k - 1)),
    Mutation("topk-best-k", "k+1", "off-by-one k: keeps k + 1", lambda: _topk_encode(lambda k, d: k + 1)),
    Mutation(
        "topk-best-k",
        "wrong-sign",
        "wrong sign: sends -g on the support",
        lambda: _topk_encode(lambda k, d: k, sign=-1.0),
    ),
    Mutation(
        "randk-contraction", "seed-ignored", "the call seed is ignored: always the same k coordinates", _randk_fixed
    ),
    Mutation(
        "randk-contraction", "largest-k", "the k largest magnitudes kept instead of k random ones", _randk_largest
    ),
    Mutation("randk-contraction", "k+1", "off-by-one k: keeps k + 1", lambda: _randk(k_shift=1), _RANDK_WHY),
    Mutation(
        "randk-contraction",
        "scaled",
        "wrong scale: values multiplied by d/k in the biased variant",
        lambda: _randk(scaled=True),
    ),
    Mutation("wangni-variance", "not-rescaled", "values sent as g instead of g / p", _wangni_not_rescaled),
    Mutation("wangni-variance", "p-energy", "probabilities proportional to g^2 instead of |g|", _wangni_energy),
    Mutation(
        "wangni-variance",
        "p-doubled",
        "wrong scale: probabilities doubled (density 2 delta)",
        lambda: _wangni_probabilities(lambda p: (2 * p).clamp(max=1.0)),
    ),
    Mutation("ndqsg-failure", "enc-dither-x2", "dither doubled at the encoder", lambda: _nested(encode_u=2.0)),
    Mutation(
        "ndqsg-failure", "dec-dither-kept", "decoder forgets to subtract the dither", lambda: _nested(decode_u=0.0)
    ),
    Mutation("ndqsg-failure", "side-x1.3", "side information scaled by 1.3", lambda: _nested(side=1.3)),
    Mutation("ndqsg-failure", "k-1", "off-by-one k: decoder's coarse step (k - 1) Delta1", lambda: _nested(k_shift=-1)),
    Mutation("ndqsg-error", "enc-dither-x2", "dither doubled at the encoder", lambda: _nested(encode_u=2.0)),
    Mutation("ndqsg-error", "dec-dither-kept", "decoder forgets to subtract the dither", lambda: _nested(decode_u=0.0)),
    Mutation("ndqsg-error", "k-1", "off-by-one k: decoder's coarse step (k - 1) Delta1", lambda: _nested(k_shift=-1)),
    Mutation(
        "ndqsg-failure-chebyshev",
        "enc-dither-x2",
        "dither doubled at the encoder",
        lambda: _nested(encode_u=2.0),
        _CHEBYSHEV_WHY,
        "ndqsg-failure",
    ),
    Mutation(
        "ndqsg-failure-chebyshev",
        "side-x1.3",
        "side information scaled by 1.3",
        lambda: _nested(side=1.3),
        _CHEBYSHEV_WHY,
        "ndqsg-failure",
    ),
    Mutation(
        "ndqsg-failure-chebyshev",
        "k-1",
        "off-by-one k: decoder's coarse step (k - 1) Delta1",
        lambda: _nested(k_shift=-1),
        _CHEBYSHEV_WHY,
        "ndqsg-failure",
    ),
    *(
        Mutation(c, name, bug, patch)
        for c in (
            "sidco-binomial-exponential",
            "sidco-binomial-gamma-mle",
            "sidco-binomial-gamma",
            "sidco-binomial-genpareto",
        )
        for name, bug, patch in (
            (
                "delta/2",
                "signed-gradient quantile F^-1(1 - delta/2) applied to |g|",
                lambda: _tail_quantile(lambda o, d, p, t, q: o(d, p, t / 2, q)),
            ),
            ("scale-x1.05", "wrong constant: fitted scale 5 % too large", lambda: _tail_quantile(_scaled_params)),
        )
    ),
    Mutation(
        "gmc-memory",
        "memory-kept",
        "memory never cleared: u <- g + u",
        _memory_never_cleared,
        _GMC_MEMORY_WHY,
        "gmc-memory-recursion",
    ),
    Mutation(
        "gmc-memory",
        "no-1/p",
        "gradient not divided by p",
        lambda: _gmc_round("no-1/p"),
        _GMC_MEMORY_WHY,
        "gmc-memory-recursion",
    ),
    Mutation("gmc-memory-recursion", "memory-kept", "memory never cleared: u <- g + u", _memory_never_cleared),
    Mutation(
        "gmc-memory-recursion", "momentum-sign", "wrong sign of the momentum term", lambda: _gmc_round("momentum-sign")
    ),
    Mutation("gmc-memory-recursion", "no-1/p", "gradient not divided by p", lambda: _gmc_round("no-1/p")),
    Mutation(
        "gmc-cr",
        "double-momentum",
        "server adds beta (w_t - w_{t-1}) to the sparse update",
        lambda: _gmc_round("double-momentum"),
    ),
    Mutation("gmc-cr", "s+1", "off-by-one k: masks of s + 1 coordinates", lambda: _randk(k_shift=1)),
    Mutation(
        "gmc-cr-exact",
        "double-momentum",
        "server adds beta (w_t - w_{t-1}) to the sparse update",
        lambda: _gmc_round("double-momentum"),
        "the exact CR counts the union of the masks, which the server's update does not change",
        "gmc-cr",
    ),
    Mutation("gmc-cr-exact", "s+1", "off-by-one k: masks of s + 1 coordinates", lambda: _randk(k_shift=1)),
    Mutation("gmc-cr-exact", "s-1", "off-by-one k: masks of s - 1 coordinates", lambda: _randk(k_shift=-1)),
    Mutation(
        "qcs-feedback-recursion", "no-decay", "residual never decays: r <- r + e", lambda: _feedback(lambda b: (b, 1.0))
    ),
    Mutation("qcs-feedback-recursion", "sign", "wrong sign: r <- (1 - beta) r - e", _residual_sign_flipped),
    Mutation(
        "qcs-feedback-recursion",
        "weight-1",
        "feedback weight 1 instead of beta: z = g + r",
        lambda: _feedback(lambda b: (1.0, 1.0 - b)),
    ),
    Mutation("qcs-feedback-recursion", "error-x2", "wrong constant: r <- (1 - beta) r + 2 e", _error_doubled),
    *(
        Mutation(c, name, bug, patch, why, "qcs-feedback-recursion" if why else "")
        for c in (
            "qcs-feedback-unbiased",
            "qcs-feedback-mmse",
            "qcs-feedback-mmse-minkowski",
            "qcs-feedback-karimireddy",
        )
        for name, bug, patch, why in (
            ("no-decay", "residual never decays: r <- r + e", lambda: _feedback(lambda b: (b, 1.0)), ""),
            ("error-x2", "wrong constant: r <- (1 - beta) r + 2 e", _error_doubled, ""),
            ("sign", "wrong sign: r <- (1 - beta) r - e", _residual_sign_flipped, _SIGN_WHY),
        )
    ),
    *(
        Mutation(
            c, "weight-1", "feedback weight 1 instead of beta: z = g + r", lambda: _feedback(lambda b: (1.0, 1.0 - b))
        )
        for c in ("qcs-feedback-unbiased", "qcs-feedback-mmse-minkowski")
    ),
)


def run_mutation(m: Mutation, size: Size = "quick", seed: int = 0) -> dict[str, object]:
    """Run ``m``'s check with the bug planted; the row of the kill table."""
    check = registry.get(m.check)
    t0 = time.perf_counter()
    with planted(m):
        try:
            r = check.run(size, seed=seed)
            verdict: str = r.verdict
            detail = "" if r.estimate is None else f"{r.estimate} vs {r.theory:.4g}"
        except Exception as exc:  # a bug that crashes the check is caught too: report it as such
            verdict, detail = "error", f"{type(exc).__name__}: {exc}"[:120]
    killed = verdict in ("violated", "error")
    return {
        "check": m.check,
        "mutation": m.name,
        "bug": m.bug,
        "verdict": verdict,
        "killed": killed,
        "measured": detail,
        "why_survives": ""
        if killed
        else (m.why or "not explained") + (f"; caught by {m.caught_by}" if m.caught_by else ""),
        "caught_by": "" if killed else m.caught_by,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def kill_table(size: Size = "quick", seed: int = 0) -> pd.DataFrame:
    """Every mutation of :data:`MUTATIONS` run against its check."""
    return pd.DataFrame([run_mutation(m, size, seed) for m in MUTATIONS])


def render(df: pd.DataFrame) -> str:
    """The kill-rate table as Markdown: totals, per-check counts, every mutation, survivors with why."""
    killed, total = int(df["killed"].sum()), len(df)
    per = df.groupby("check", sort=False)["killed"].agg(["sum", "count"]).reset_index()
    per.columns = ["check", "killed", "planted"]
    per["kill rate"] = [f"{k / n:.0%}" for k, n in zip(per["killed"], per["planted"], strict=True)]
    survivors = df[~df["killed"]]
    lines = [
        "# Mutation suite: planted bugs against the validation checks",
        "",
        f"{killed} of {total} planted bugs caught ({killed / total:.0%}) by {df['check'].nunique()} checks "
        f"(quick Monte Carlo sizes, seed 0, synthetic Laplace(1) vectors, 99 % intervals). A bug is caught when "
        "its check's verdict turns to *violated* (or the check crashes).",
        "",
        "Regenerate with `python -m gradstat.analysis.validation.mutations --out reports/mutations.md`; the "
        "same mutations run in the default test suite (`tests/validation/test_mutations.py`).",
        "",
        "## Kill rate per check",
        "",
        to_markdown(per),
    ]
    if not survivors.empty:
        elsewhere = survivors[survivors["caught_by"].astype(bool)] if "caught_by" in survivors else survivors[:0]
        nowhere = survivors.drop(elsewhere.index)
        lines += [
            "## Survivors",
            "",
            f"{len(survivors)} survive their check; {len(elsewhere)} of them are caught by the companion check "
            f"named (the same bug planted there), {len(nowhere)} by no check"
            + (
                f" ({', '.join(f'`{r.check}` / `{r.mutation}`' for r in nowhere.itertuples())})."
                if len(nowhere)
                else "."
            )
            + " Each says why its check cannot see it:",
            "",
        ]
        lines += [f"- `{r.check}` / `{r.mutation}` ({r.bug}): {r.why_survives}" for r in survivors.itertuples()]
        lines.append("")
    lines += ["## Every planted bug", "", to_markdown(df.drop(columns=["seconds", "caught_by"], errors="ignore"))]
    return "\n".join(lines)


def write_kill_table(path: str | Path, size: Size = "quick", seed: int = 0) -> pd.DataFrame:
    df = kill_table(size, seed)
    atomic_write_text(path, render(df))
    return df


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/mutations.md", help="Markdown file to write")
    args = parser.parse_args(argv)
    df = write_kill_table(args.out)
    print(f"{int(df['killed'].sum())} of {len(df)} planted bugs caught; table in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
