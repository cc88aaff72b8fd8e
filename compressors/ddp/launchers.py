"""Registering gradstat's hook under the launchers that wrap DDP, and noticing when it never ran.

A communication hook only compresses when it is registered on the ``DistributedDataParallel`` module that trains.
Some launchers take a hook through an option of their own and do not always use it: Accelerate's
``DistributedDataParallelKwargs(comm_hook=...)`` accepts only its own ``DDPCommunicationHookType`` values and trains
with DDP's default all-reduce when given a callable, saying nothing; Lightning's ``DDPStrategy(ddp_comm_hook=...,
ddp_comm_state=...)`` registers the hook only on CUDA devices and drops it the same way on CPU. Two remedies, one per
function:

- :func:`register_hook`: build the hook for a compressor and register it on the DDP model itself (what
  ``accelerator.prepare(model)`` returns, what a torchrun script wraps), bound to the module it wraps;
- :class:`HookWatch` / :func:`expect_hook`: before every optimizer step, check that the hook ran during the backward
  pass since the last step, and raise :class:`HookNeverRan` (a ``RuntimeError``) saying so otherwise. Under
  Lightning, a callback calls :func:`register_hook` on ``trainer.strategy.model`` in ``on_fit_start`` and
  :meth:`HookWatch.check` in ``on_before_optimizer_step``.

``docs/guide/launchers.md`` gives the recipes for torchrun, Accelerate and Lightning.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradstat.compressors.ddp.hook import make_hook
from gradstat.compressors.ddp.state import CompressionHookState


class HookNeverRan(RuntimeError):
    """An optimizer step came after a backward pass in which gradstat's hook did not run: DDP averaged the
    gradients with its default all-reduce, uncompressed."""


class HookWatch:
    """Watches one hook state: :meth:`check` raises :class:`HookNeverRan` when the hook completed no step (its last
    bucket) since the previous check (or since the watch began)."""

    def __init__(self, state: CompressionHookState) -> None:
        if not isinstance(state, CompressionHookState):
            raise TypeError(f"HookWatch watches gradstat's CompressionHookState, got {type(state).__name__}")
        self.state = state
        self._seen = state.memory.step

    def check(self) -> None:
        """Call before each optimizer step (after its backward passes)."""
        step = self.state.memory.step
        if step == self._seen:
            raise HookNeverRan(
                f"gradstat's communication hook did not run during the backward pass before this optimizer step "
                f"(hook step counter still {step}): DDP averaged the gradients with its default all-reduce, "
                "uncompressed. The hook is not registered on the DistributedDataParallel model that trains; "
                "Accelerate's DistributedDataParallelKwargs(comm_hook=...) drops a callable hook silently, and so "
                "does Lightning's DDPStrategy(ddp_comm_hook=...) on CPU. Register it on the wrapped model instead: "
                "gradstat.compressors.ddp.register_hook(model, compressor, feedback, optimizer=optimizer) after "
                "accelerator.prepare(...) or DistributedDataParallel(...), or on trainer.strategy.model in a "
                "Lightning callback's on_fit_start"
            )
        self._seen = step


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer that steps: the one a launcher's wrapper holds as ``.optimizer`` (Accelerate's
    ``AcceleratedOptimizer`` subclasses ``Optimizer`` but takes no step pre-hooks of its own), else ``optimizer``."""
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    raise TypeError(
        f"expected a torch optimizer or a wrapper holding one as .optimizer, got {type(optimizer).__name__}"
    )


def expect_hook(state: CompressionHookState, optimizer: Any) -> torch.utils.hooks.RemovableHandle:
    """Check before every ``optimizer.step()`` that the hook of ``state`` ran (:class:`HookWatch`); the handle
    removes the check."""
    watch = HookWatch(state)
    return torch_optimizer(optimizer).register_step_pre_hook(lambda opt, args, kwargs: watch.check())


def register_hook(
    model: nn.Module,
    compressor: str | None,
    feedback: str = "none",
    *,
    optimizer: Any = None,
    **options: Any,
) -> CompressionHookState:
    """Build gradstat's hook for ``compressor`` and ``feedback`` (:func:`~gradstat.compressors.ddp.hook.make_hook`,
    ``options`` passed on: seed, granularity, exchange, process_group, ...), bound to the module ``model`` wraps,
    and register it on ``model``, the ``DistributedDataParallel`` module that trains (what
    ``accelerator.prepare(model)`` returns). With ``optimizer`` (a torch optimizer or Accelerate's wrapper), every
    step then checks that the hook ran (:func:`expect_hook`). Returns the hook state (metrics, ``state_dict``).

    Raises TypeError when ``model`` is not a ``DistributedDataParallel`` module (a model not yet prepared, or a
    single-process run where the launcher does not wrap it)."""
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"register_hook needs the DistributedDataParallel model that trains, got {type(model).__name__}: call "
            "it after accelerator.prepare(model) (which wraps the model when there are several processes) or "
            "DistributedDataParallel(model)"
        )
    state, hook = make_hook(compressor, feedback, model=model.module, **options)
    model.register_comm_hook(state, hook)
    if optimizer is not None:
        expect_hook(state, optimizer)
    return state
