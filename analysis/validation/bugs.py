"""The planted bugs of the mutation suite: each function returns the ``mock.patch`` context managers that plant one
mistake in the code a validation check covers.

Every bug goes where the default configuration computes, whatever backend runs there (the C loops, a compiled
kernel or the eager tiles): it is planted at the Python level around those loops, on their inputs or on their
outputs, never inside one backend's form. The dithered quantizers' bugs wrap
:class:`~gradstat.compressors.schemes.quantizers.dither.ScaledQuantizer` (its decode's output, or the input of the
row loop its encode runs, ``dither._counter_rows``); NDQSG's wrap its ``_encode`` and ``_decode``. The dither a bug
adds or removes is the one the code draws (the counter hash of the payload's seed, regenerated here), so a bug
"dither kept at the decoder" is exactly ``(c + offset) / gain * scale``. The suite counts the calls of every patch
(:mod:`gradstat.analysis.validation.planting`): a bug whose patch never runs fails the suite.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Callable
from unittest import mock

import torch

if TYPE_CHECKING:
    from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer
    from gradstat.compressors.schemes.quantizers.qcs import QCS


# -- the dithered quantizers (QCS, DQSG, QSGD, half-dithered) ----------------------------------------------------
def _dither(seed: int, d: int, device: torch.device) -> torch.Tensor:
    """The counter dither of elements 0..d-1 of ``seed`` (what the encoder adds and the decoder subtracts)."""
    from gradstat.compressors.schemes.quantizers.dither import DITHER_STREAM
    from gradstat.theory.kernels import counter_dither

    key = counter_dither.keys(seed, DITHER_STREAM, device)
    zero = torch.zeros((), dtype=torch.int32, device=device)
    return counter_dither.dither_rows(1, d, zero, key, device).reshape(-1)


def _per_element(scales: torch.Tensor, size: int, d: int) -> torch.Tensor:
    """Bucket values ``scales`` (one per bucket of ``size``) repeated for each of the ``d`` elements."""
    return scales.reshape(-1).repeat_interleave(size)[:d]


def _step(q: ScaledQuantizer, scales: torch.Tensor, d: int) -> torch.Tensor:
    """Each element's quantization step (its bucket's scale over the gain): one unit of dither in output units."""
    gain = q._range[3]
    return _per_element(scales.float(), q.bucket_size(d), d) / gain


def decoder_dither(extra: float) -> list:
    """The decoder adds ``extra`` dithers to a correct reconstruction: 1 keeps the dither (not subtracted), 2 adds
    it instead of subtracting it (sign flipped)."""
    from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer

    orig = ScaledQuantizer.decode

    def decode(self, payload, d, seed):  # noqa: ANN001, ANN202
        out = orig(self, payload, d, seed)
        if not self.subtract:
            return out
        u = self._dither_reference(d, seed, out.device)  # the dither the encoder added (counter or torch's)
        return out + extra * u * _step(self, payload["scales"], d).to(out.device)

    return [mock.patch.object(ScaledQuantizer, "decode", decode)]


def encoder_dither(gain_factor: float) -> list:
    """The encoder adds ``gain_factor`` dithers instead of one (2: doubled, 0: forgotten): the input of the row
    loop moved by ``(gain_factor - 1) u`` steps, so whichever backend runs computes ``floor(y + f u + shift)``."""
    import gradstat.compressors.schemes.quantizers.dither as dq
    from gradstat.theory.kernels import counter_dither

    orig = dq._counter_rows

    def rows(fn, out, src, size, factor, key, args):  # noqa: ANN001, ANN202
        if fn is counter_dither.quantize_rows_into and src is not None:
            d = src.numel()
            zero = torch.zeros((), dtype=torch.int32, device=src.device)
            u = counter_dither.dither_rows(1, d, zero, key, src.device).reshape(-1)
            step = _per_element(factor, size, d) / args[0]
            src = src + (gain_factor - 1.0) * u * step
        return orig(fn, out, src, size, factor, key, args)

    return [mock.patch.object(dq, "_counter_rows", rows)]


def decoder_seed(shift: int) -> list:
    """The decoder regenerates the dither from ``seed + shift``."""
    from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer

    orig = ScaledQuantizer.decode
    return [mock.patch.object(ScaledQuantizer, "decode", lambda self, p, d, seed: orig(self, p, d, seed + shift))]


def quantizer_scaled(factor: float) -> list:
    """The quantizer's reconstruction times ``factor`` (a wrong constant in the decoder's scale)."""
    from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer

    orig = ScaledQuantizer.decode
    return [mock.patch.object(ScaledQuantizer, "decode", lambda self, p, d, seed: orig(self, p, d, seed) * factor)]


def levels_off_by_one() -> list:
    """The receiver divides the scale by L + 1 instead of L (codes -L..L read as -(L+1)..L+1 levels)."""
    from gradstat.compressors.schemes.quantizers.dither import ScaledQuantizer

    orig = ScaledQuantizer.decode

    def decode(self, payload, d, seed):  # noqa: ANN001, ANN202
        return orig(self, payload, d, seed) * (self.levels / (self.levels + 1))

    return [mock.patch.object(ScaledQuantizer, "decode", decode)]


def scale_squared() -> list:
    """The encoder sends ``||x||^2`` as the bucket scale instead of ``||x||`` (the codes use the right one)."""
    import gradstat.compressors.schemes.quantizers.dither as dither
    from gradstat.compressors.wire.payload import Payload

    state = {"encoding": False}
    enc = dither.ScaledQuantizer.encode

    def encode(self, x, payload, seed, *args, **kwargs):  # noqa: ANN001, ANN202
        state["encoding"] = True
        try:
            return enc(self, x, payload, seed, *args, **kwargs)
        finally:
            state["encoding"] = False

    add = Payload.add

    def add_part(self, name, tensor, *a, **k):  # noqa: ANN001, ANN202
        if name == "scales" and state["encoding"]:
            tensor = tensor * tensor
        return add(self, name, tensor, *a, **k)

    return [mock.patch.object(dither.ScaledQuantizer, "encode", encode), mock.patch.object(Payload, "add", add_part)]


# -- QCS ---------------------------------------------------------------------------------------------------------
def qcs_alpha(value: Callable[[QCS], float]) -> list:
    from gradstat.compressors.schemes.quantizers.qcs import QCS

    return [mock.patch.object(QCS, "reconstruction_scale", value)]


def qcs_mix_scaled(factor: Callable[[int, int], float]) -> list:
    import gradstat.compressors.schemes.quantizers.qcs as qcs

    orig = qcs.mix
    return [mock.patch.object(qcs, "mix", lambda blocks, r, k: orig(blocks, r, k) * factor(blocks.shape[-1], k))]


def qcs_signs_01() -> list:
    import gradstat.compressors.schemes.quantizers.qcs as qcs

    orig = qcs.signs
    return [mock.patch.object(qcs, "signs", lambda shape, seed, device: (orig(shape, seed, device) + 1) / 2)]


def qcs_signs_seed(shift: int) -> list:
    """QCS's decoder regenerates the signs r from ``seed + shift`` (its quantizer's dither from the right seed)."""
    import gradstat.compressors.schemes.quantizers.qcs as qcs

    def decode(self, payload, ctx, side):  # noqa: ANN001, ANN202
        seed = payload.seed
        rows = math.ceil(payload.numel / self.block)
        v_hat = self._quantizer().decode(payload, rows * self.k, seed).reshape(rows, self.k)
        r = self._signs_reference((rows, self.block), seed + shift, v_hat.device)
        return (self.reconstruction_scale() * qcs.unmix(v_hat, r)).reshape(-1)[: payload.numel]

    return [mock.patch.object(qcs.QCS, "_decode", decode)]


# -- NDQSG -------------------------------------------------------------------------------------------------------
def nested(encode_dither: float = 1.0, keep_dither: bool = False, side: float = 1.0, k_shift: int = 0) -> list:
    """NDQSG's nested worker with one mistake, planted around ``_encode`` / ``_decode`` so the C loop, the
    compiled kernel and the eager tiles all see it: ``encode_dither`` dithers added at the encoder (the input
    moved by ``(f - 1) u Delta1 kappa / alpha``, the scale it sends kept); ``keep_dither``: the decoder does not
    subtract the dither (side information moved by ``-u Delta1 kappa / alpha`` and the output moved back);
    ``side``: side information scaled; ``k_shift``: the decoder's coarse step ``(k + k_shift) Delta1``."""
    import gradstat.compressors.schemes.quantizers.ndqsg as nd

    patches: list[Any] = []
    if encode_dither != 1.0:
        enc = nd.NDQSG._encode

        def encode(self, g, payload, ctx):  # noqa: ANN001, ANN202
            if ctx.worker < self.p1:
                return enc(self, g, payload, ctx)
            kappa = g.abs().max()
            safe = float(kappa) if float(kappa) > 0 else 1.0
            u = _dither(ctx.call_seed, g.numel(), g.device).reshape(g.shape) * self.fine_step
            moved = g + (encode_dither - 1.0) * u * safe / self.alpha
            with mock.patch.object(nd, "max_abs", lambda x: kappa):
                return enc(self, moved, payload, ctx)

        patches.append(mock.patch.object(nd.NDQSG, "_encode", encode))
    if keep_dither or side != 1.0 or k_shift:
        dec = nd.NDQSG._decode

        def decode(self, payload, ctx, y):  # noqa: ANN001, ANN202
            if "nested" not in payload.parts:
                return dec(self, payload, ctx, y)
            me = dataclasses.replace(self, delta2=self.fine_step * (self.nesting + k_shift)) if k_shift else self
            y = y * side
            if not keep_dither:
                return dec(me, payload, ctx, y)
            moved = (
                _dither(payload.seed, payload.numel, y.device) * self.fine_step * payload["scales"].float() / self.alpha
            )
            return dec(me, payload, ctx, y - moved) + moved

        patches.append(mock.patch.object(nd.NDQSG, "_decode", decode))
    return patches


def decoded_scaled(cls: Any, factor: float) -> list:
    """``cls``'s decode output times ``factor`` (a wrong constant at the receiver)."""
    orig = cls._decode
    return [mock.patch.object(cls, "_decode", lambda self, p, ctx, side: orig(self, p, ctx, side) * factor)]


# -- sparsifiers -------------------------------------------------------------------------------------------------
def topk_encode(k_of: Callable[[int, int], int], largest: bool = True, sign: float = 1.0, factor: float = 1.0) -> list:
    """Top-k's encoder keeping ``k_of(k, d)`` magnitudes (the smallest unless ``largest``), sending
    ``sign * factor * g`` on them."""
    from gradstat.compressors.schemes.sparsifiers.threshold import add_sparse
    from gradstat.compressors.schemes.sparsifiers.topk import TopK

    def encode(self, g, payload, ctx):  # noqa: ANN001, ANN202
        d = g.numel()
        k = k_of(math.ceil(self.ratio * d), d)
        idx = torch.topk(g.abs(), k, largest=largest, sorted=False).indices
        add_sparse(payload, sign * factor * g, idx, self.packed)

    return [mock.patch.object(TopK, "_encode", encode)]


def randk(k_shift: int = 0, scaled: bool = False, factor: float = 1.0) -> list:
    """Random-k whose encoder draws ``k + k_shift`` indices (the decoder follows the count it receives)."""
    import gradstat.compressors.schemes.sparsifiers.randk as rk

    def encode(self, g, payload, ctx):  # noqa: ANN001, ANN202
        d = g.numel()
        k = math.ceil(self.ratio * d) + k_shift
        values = g[rk.random_subset(d, k, ctx.call_seed, g.device)] * factor
        payload.add("values", (values * (d / k) if scaled else values).float(), 32, "value")
        payload.add_seed(ctx.call_seed)

    return [mock.patch.object(rk.RandK, "_encode", encode)]


def randk_seed(seed_of: Callable[[int], int]) -> list:
    """Random-k's subsets drawn from ``seed_of(seed)`` at both ends (a constant: the same k coordinates always)."""
    import gradstat.compressors.schemes.sparsifiers.randk as rk

    orig = rk.random_k_indices  # (what encode and decode draw with, on every device)
    return [mock.patch.object(rk, "random_k_indices", lambda d, k, seed, dev: orig(d, k, seed_of(seed), dev))]


def randk_largest() -> list:
    import gradstat.compressors.schemes.sparsifiers.randk as rk

    def encode(self, g, payload, ctx):  # noqa: ANN001, ANN202
        k = math.ceil(self.ratio * g.numel())
        idx = torch.topk(g.abs(), k).indices
        payload.add("values", g[idx].float(), 32, "value")
        payload.add("indices", idx.int(), 32, "index")
        payload.add_seed(ctx.call_seed)

    def decode(self, payload, ctx, side):  # noqa: ANN001, ANN202
        out = torch.zeros(payload.numel, dtype=torch.float32)
        return out.index_put_((payload["indices"].long(),), payload["values"])

    return [mock.patch.object(rk.RandK, "_encode", encode), mock.patch.object(rk.RandK, "_decode", decode)]


def wangni_probabilities(transform: Callable[[torch.Tensor], torch.Tensor], energy: bool = False) -> list:
    """Wangni's keep probabilities transformed (or computed from ``g^2`` instead of ``|g|`` when ``energy``)."""
    import gradstat.compressors.schemes.sparsifiers.wangni as wangni

    orig = wangni.optimal_probabilities
    return [mock.patch.object(wangni, "optimal_probabilities", lambda a, k: transform(orig(a * a if energy else a, k)))]


def wangni_not_rescaled() -> list:
    import gradstat.compressors.schemes.sparsifiers.wangni as wangni

    def encode(self, g, payload, ctx):  # noqa: ANN001, ANN202
        d = g.numel()
        p = wangni.optimal_probabilities(g.abs(), math.ceil(self.ratio * d))
        wangni.add_sparse(payload, g, wangni.coins(p, ctx.call_seed), self.packed)  # g, not g / p

    return [mock.patch.object(wangni.Wangni, "_encode", encode)]


# -- SIDCo -------------------------------------------------------------------------------------------------------
def tail_quantile(change: Callable) -> list:
    import gradstat.theory.thresholds as th

    orig = th.tail_quantile
    return [
        mock.patch.object(
            th, "tail_quantile", lambda dist, params, tail, q="exact": change(orig, dist, params, tail, q)
        )
    ]


def fitted_scale(factor: float) -> Callable:
    """A :func:`tail_quantile` change: the fitted scale times ``factor``."""
    return lambda orig, dist, params, tail, q: orig(dist, {**params, "scale": params["scale"] * factor}, tail, q)


# -- GMC and error feedback --------------------------------------------------------------------------------------
def gmc_round(variant: str, factor: float = 1.0) -> list:
    """GMC's round (:meth:`GlobalMomentumCompression.round`) with one line wrong: ``no-1/p`` (the gradient not
    divided by p), ``momentum-sign``, ``momentum-scaled`` (beta times ``factor``), ``grad-scaled`` (g / p times
    ``factor``), ``memory-kept`` (u <- g + u), ``double-momentum`` (the server adds beta (w_t - w_{t-1}))."""
    from gradstat.compressors.memory.feedback import ErrorFeedback
    from gradstat.compressors.memory.momentum import GlobalMomentumCompression
    from gradstat.compressors.memory.send import feedback_round

    def round_(self, grads, states, shared, ctx=None):  # noqa: ANN001, ANN202
        p = len(grads)
        last = shared.last_update
        div = 1 if variant == "no-1/p" else p
        g_factor = factor if variant == "grad-scaled" else 1.0
        beta = self.momentum * (factor if variant == "momentum-scaled" else 1.0)
        sign = -1.0 if variant == "momentum-sign" else 1.0
        g = [
            g_factor * x.float() / div
            if last is None
            else g_factor * x.float() / div - sign * (beta / (p * self.lr)) * last
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


def memory_never_cleared() -> list:
    """Error feedback stores z instead of z - C(z) (the sent coordinates are not removed from memory)."""
    from gradstat.compressors.memory.feedback import ErrorFeedback

    orig = ErrorFeedback.update
    return [
        mock.patch.object(
            ErrorFeedback, "update", lambda self, z, z_hat, st: orig(self, z, torch.zeros_like(z_hat), st)
        )
    ]


def error_scaled(factor: float) -> list:
    """Error feedback adds ``factor (z - C(z))`` to the memory (a wrong constant)."""
    from gradstat.compressors.memory.feedback import ErrorFeedback

    orig = ErrorFeedback.update

    def update(self, z, z_hat, state):  # noqa: ANN001, ANN202
        orig(self, z_hat.float() + factor * (z.float() - z_hat.float()), z_hat, state)

    return [mock.patch.object(ErrorFeedback, "update", update)]


def feedback(make: Callable[[float], tuple[float, float]]) -> list:
    """QCS's feedback built as ``ErrorFeedback(*make(beta))`` (weight, decay) instead of ``(beta, 1 - beta)``."""
    from gradstat.compressors.memory.feedback import ErrorFeedback

    return [mock.patch.object(ErrorFeedback, "qcs", classmethod(lambda cls, beta: cls(*make(beta))))]


def residual_sign_flipped() -> list:
    from gradstat.compressors.memory.feedback import ErrorFeedback

    orig = ErrorFeedback.update
    return [mock.patch.object(ErrorFeedback, "update", lambda self, z, z_hat, st: orig(self, z_hat, z, st))]
