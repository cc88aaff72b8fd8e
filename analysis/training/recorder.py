"""Recording gradients from training into a dump.

:class:`Recorder` attaches to any ``torch.nn.Module`` training loop: it writes the parameter gradients every K
steps, after backward and before the optimizer step (through an optimizer step pre-hook, or by calling
:meth:`Recorder.record` from a custom loop). A step that is not recorded costs one modulo: nothing is copied.

:func:`record` trains a built-in workload with P simulated workers (:mod:`gradstat.analysis.training.parallel`),
optionally with a compressor and error feedback in the loop, and records it.

Under DDP, :func:`record_ranks` (one call on every rank) records each rank's local gradient as ``worker = rank``
through :class:`RankRecorder`; the single-process :class:`Recorder` refuses a distributed run
(:func:`refuse_under_ddp`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from tqdm import tqdm

from gradstat.analysis.dumps import DumpWriter
from gradstat.analysis.dumps.format import RECORDED_DEVICE_KEY
from gradstat.analysis.training.parallel import DataParallel
from gradstat.analysis.training.workloads import get_workload
from gradstat.compressors import create, parse_feedback
from gradstat.compressors.context import derive_seed

Grads = Mapping[str, torch.Tensor]


class Recorder:
    """Writes gradients into ``writer`` on the steps ``step % every == 0``.

    Parameters
    ----------
    writer : an open :class:`~gradstat.analysis.dumps.DumpWriter` (new or appending).
    every : recording interval K >= 1 (training steps).
    """

    def __init__(self, writer: DumpWriter, every: int = 1) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.writer, self.every = writer, every
        self._step = 0

    @classmethod
    def create(
        cls,
        path: str | Path,
        model: nn.Module,
        workload: str,
        every: int = 1,
        workers: int = 1,
        dtype: str = "float32",
        **manifest: Any,
    ) -> "Recorder":
        """A recorder writing a new dump at ``path`` of ``model``'s trainable parameters (model order).
        ``manifest`` keywords (optimizer, seeds, metadata, extras, compression) go to :class:`DumpWriter`, the
        metadata with the device type the parameters live on (:func:`with_device`).
        Refused inside a distributed run (:func:`refuse_under_ddp`): use :func:`record_ranks` there."""
        refuse_under_ddp(model, "Recorder.create")
        params = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
        manifest = with_device(manifest, model)
        writer = DumpWriter(
            path, workload=workload, params=params, workers=workers, dtype=dtype, every=every, **manifest
        )
        return cls(writer, every)

    def wants(self, step: int) -> bool:
        """Whether training step ``step`` is recorded."""
        return step % self.every == 0

    def record(self, step: int, grads: Sequence[Grads], extras: Mapping[str, Sequence[Grads]] | None = None) -> bool:
        """Write ``grads`` (one dict per worker) if ``step`` is recorded; return whether it was."""
        if not self.wants(step):
            return False
        self.writer.write_step(step, grads, extras)
        return True

    def attach(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, start: int = 0
    ) -> torch.utils.hooks.RemovableHandle:
        """Record ``model``'s gradients (one worker) before every ``optimizer.step()``, counting steps from
        ``start``. Returns the hook handle (``.remove()`` detaches). Refused inside a distributed run
        (:func:`refuse_under_ddp`): use :func:`record_ranks` there."""
        refuse_under_ddp(model, "Recorder.attach")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._step = start

        def hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            step, self._step = self._step, self._step + 1
            if self.wants(step):
                missing = [n for n, p in named if p.grad is None]
                if missing:
                    raise ValueError(f"step {step}: no gradient for {missing[:3]}; call backward() before step()")
                self.record(step, [{n: p.grad for n, p in named if p.grad is not None}])  # none missing (checked)

        return optimizer.register_step_pre_hook(hook)


def with_device(manifest: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """``manifest`` with its ``metadata`` saying the device type ``model``'s parameters live on (where a replay
    reproduces the run bit for bit: :mod:`gradstat.analysis.studies.replay_device`), unless the caller says."""
    first = next(iter(model.parameters()), None)
    if first is None:
        return manifest
    metadata = dict(manifest.get("metadata") or {})
    metadata.setdefault(RECORDED_DEVICE_KEY, first.device.type)
    return {**manifest, "metadata": metadata}


def refuse_under_ddp(model: nn.Module, where: str) -> None:
    """Raise ValueError when ``model`` is wrapped by ``DistributedDataParallel`` or ``torch.distributed`` runs
    with more than one rank: the single-process :class:`Recorder` would write every rank into the same one-worker
    dump (ranks overwriting each other's manifest) or, on rank 0 only, the gradient after the hook averaged it."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if isinstance(model, DistributedDataParallel) or ranks > 1:
        inside = "a DistributedDataParallel model" if ranks == 1 else f"a distributed run of {ranks} ranks"
        raise ValueError(
            f"{where}: the single-process Recorder inside {inside} would record the averaged gradient or clash "
            "between ranks; use gradstat.analysis.training.recorder.record_ranks(path, ddp_model, optimizer, "
            "workload=...), the DDP recorder (RankRecorder), which writes each rank's local gradient as its worker"
        )


def record(
    workload: str,
    steps: int,
    every: int = 1,
    workers: int = 1,
    out: str | Path = "dump",
    seed: int = 0,
    dtype: str = "float32",
    compressor: str | None = None,
    feedback: str | None = None,
    progress: bool = True,
    metadata: Mapping[str, Any] | None = None,
    device: torch.device | str = "cpu",
) -> Path:
    """Train workload ``workload`` (a name or spec, see :func:`gradstat.analysis.training.workloads.get_workload`) for
    ``steps`` steps with ``workers`` simulated workers and record every ``every``-th step into a new dump at ``out``.

    ``compressor`` (spec for :func:`gradstat.compressors.create`) and ``feedback`` (spec for
    :func:`gradstat.compressors.parse_feedback`) put compression in the loop: the model is updated with the average of
    the decoded messages; the dump stores the raw gradients and, with feedback, the extras ``residual`` (memory
    before the step) and ``compensated`` (gradient plus weighted residual).

    Returns
    -------
    Path of the dump. Raises ValueError (bad arguments, output directory not usable) before training starts.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a positive integer, got {every!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if feedback is not None and compressor is None:
        raise ValueError(f"feedback {feedback!r} needs a compressor in the loop (compressor=...)")
    wl = get_workload(workload)
    if wl.batch_size < workers:
        raise ValueError(f"workload {wl.name}: batch_size {wl.batch_size} cannot be split over {workers} workers")
    comp = create(compressor) if compressor is not None else None
    fb = parse_feedback(feedback) if feedback is not None else None
    seeds = {"seed": seed, "model": derive_seed(seed, 0), "data": derive_seed(seed, 1), "compressor": seed}
    model = wl.model(seeds["model"], device)
    dp = DataParallel(model, wl.optimizer(model), wl.loss, workers, comp, fb, seed=seeds["compressor"])
    compression = (
        {"compressor": comp.spec(), "feedback": feedback or "none", "granularity": "whole model"} if comp else None
    )
    meta = {"workload_config": wl.config(), "workload_spec": wl.spec(), **wl.metadata(), **dict(metadata or {})}
    meta[RECORDED_DEVICE_KEY] = torch.device(device).type  # where a replay reproduces the run (studies.replay_device)
    rec = Recorder.create(
        out,
        model,
        wl.name,
        every=every,
        workers=workers,
        dtype=dtype,
        optimizer=wl.optimizer_config(),
        seeds=seeds,
        metadata=meta,
        extras=dp.extras,
        compression=compression,
    )
    batches = wl.batches(seeds["data"], device)
    bar = tqdm(range(steps), desc=f"record {wl.name}", unit="step", disable=not progress, leave=False)
    for t in bar:
        x, y = next(batches)
        result = dp.step(t, x, y)
        rec.record(t, result.grads, result.extras)
        bar.set_postfix(loss=f"{result.loss:.4g}", refresh=False)
    return Path(out)


class RankRecorder:
    """Per-rank recording of a DDP run: every rank writes its own *local* gradient (before averaging and
    compression) as ``worker = rank``, and the feedback residual before the step when asked.

    The recorder observes the compression hook (:class:`gradstat.compressors.ddp.CompressionHookState`, bound to
    the model), which shows it each bucket's local gradient; an optimizer step pre-hook then writes the rank's part
    file, waits for every rank (``barrier``) and rank 0 commits the step (manifest updated atomically). Rank 0
    creates the dump with :meth:`create` before training; the others open it after a barrier.

    Parameters
    ----------
    path : the dump directory; rank, world : this process's rank and the world size (= the dump's workers);
    names : the trainable parameters' names in model order; every : recording interval K;
    residual : also record the residual (the dump must declare the extra ``residual``);
    group : the process group to synchronise in.
    """

    def __init__(
        self,
        path: str | Path,
        rank: int,
        world: int,
        names: Sequence[str],
        every: int = 1,
        residual: bool = False,
        group: Any = None,
    ) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.path, self.rank, self.world, self.names = Path(path), rank, world, list(names)
        self.every, self.residual, self.group = every, residual, group
        self.writer: DumpWriter | None = None
        self._pending: int | None = None
        self._grads: dict[str, torch.Tensor] = {}
        self._residuals: dict[str, torch.Tensor] = {}
        self._step = 0

    @classmethod
    def create(
        cls,
        path: str | Path,
        model: nn.Module,
        rank: int,
        world: int,
        every: int = 1,
        residual: bool = False,
        group: Any = None,
        **manifest: Any,
    ) -> "RankRecorder":
        """On rank 0 create the dump (``manifest`` keywords go to :class:`DumpWriter`, the metadata with the device
        type the parameters live on: :func:`with_device`), then synchronise."""
        import torch.distributed as dist

        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self = cls(path, rank, world, [n for n, _ in named], every, residual, group)
        if rank == 0:
            self.writer = DumpWriter(
                path,
                params=[(n, tuple(p.shape)) for n, p in named],
                workers=world,
                every=every,
                extras=["residual"] if residual else [],
                **with_device(manifest, model),
            )
        dist.barrier(group=group)
        return self

    def attach(self, hook_state: Any, optimizer: torch.optim.Optimizer) -> torch.utils.hooks.RemovableHandle:
        """Observe ``hook_state`` (a bound compression hook state) and write before every ``optimizer.step()``."""
        if hook_state.memory.param_index is None:
            raise ValueError("the hook state must be bound to the model (make_hook(..., model=...)) to record")
        hook_state.taps.observers.append(self.observe)
        return optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.flush())

    def attach_local(self, model: nn.Module, optimizer: torch.optim.Optimizer, start: int = 0) -> list[Any]:
        """Record each parameter's local gradient as autograd computes it (a tensor hook on the parameter runs
        before DDP's reducer sees it, so it is this rank's gradient whatever hook averages it; gradients of
        several backward passes before one step, as with ``no_sync``, are summed), and write before every
        ``optimizer.step()``, counting steps from ``start``. Returns the handles (``.remove()`` each detaches)."""
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if [n for n, _ in named] != self.names:
            raise ValueError("attach_local: the model's trainable parameters are not the dump's")
        self._step = start

        def keep(name: str) -> Any:
            def hook(grad: torch.Tensor) -> None:
                if self._step % self.every == 0:
                    self._pending = self._step
                    held = self._grads.get(name)
                    self._grads[name] = grad.detach().clone() if held is None else held + grad.detach()

            return hook

        def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.flush()
            self._step += 1

        handles = [p.register_hook(keep(n)) for n, p in named]
        return [*handles, optimizer.register_step_pre_hook(before_step)]

    def observe(self, step: int, view: Any) -> None:
        """Copy one bucket's local gradients (and residuals) when ``step`` is recorded."""
        if step % self.every:
            return
        self._pending = step
        for pos, g, r in zip(view.params, view.grads, view.residuals, strict=True):
            name = self.names[pos]
            self._grads[name] = g.detach().clone()
            if self.residual:
                self._residuals[name] = torch.zeros_like(g) if r is None else r.detach().clone()

    def flush(self) -> None:
        """Write the pending step's part, wait for every rank, and commit it on rank 0."""
        import torch.distributed as dist

        from gradstat.analysis.dumps.writer import write_rank_part

        if self._pending is None:
            return
        step, self._pending = self._pending, None
        missing = [n for n in self.names if n not in self._grads]
        if missing:
            raise ValueError(f"step {step}: the hook showed no gradient for {missing[:3]}")
        extras = {"residual": self._residuals} if self.residual else None
        write_rank_part(self.path, step, self.rank, self._grads, extras)
        self._grads, self._residuals = {}, {}
        dist.barrier(group=self.group)
        if self.writer is not None:
            self.writer.commit_rank_parts(step)


def record_ranks(
    path: str | Path,
    model: nn.Module,
    optimizer: Any,
    workload: str,
    every: int = 1,
    hook_state: Any = None,
    residual: bool = False,
    group: Any = None,
    **manifest: Any,
) -> RankRecorder:
    """Record a DDP run from its own script: call it on every rank after ``init_process_group`` and after wrapping
    the model, before training; every K-th ``optimizer.step()`` then writes each rank's *local* gradient (before
    any hook averages or compresses it) as ``worker = rank`` of a new dump at ``path`` (rank 0 creates it).

    Parameters
    ----------
    model : the ``DistributedDataParallel`` model (its ``.module`` is recorded) or the module it wraps.
    optimizer : the torch optimizer, or a wrapper holding it as ``.optimizer`` (Accelerate's).
    workload : the name the dump's manifest gives the model.
    hook_state : gradstat's compression hook state (:func:`gradstat.compressors.ddp.make_hook` with
        ``model=``), when one is registered: the recorder then observes the hook, which also shows the
        error-feedback residual (``residual=True``). Without it the gradients come from tensor hooks on the
        parameters (:meth:`RankRecorder.attach_local`), under any communication hook or none.
    manifest : further :class:`DumpWriter` keywords (optimizer, seeds, metadata, compression).
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from gradstat.compressors.ddp.launchers import torch_optimizer

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("record_ranks records a distributed run: call torch.distributed.init_process_group first")
    if residual and hook_state is None:
        raise ValueError("residual=True needs gradstat's hook state (hook_state=...): only its hook keeps a residual")
    module = model.module if isinstance(model, DistributedDataParallel) else model
    try:
        inner = torch_optimizer(optimizer)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    rec = RankRecorder.create(path, module, rank, world, every, residual, group, workload=workload, **manifest)
    if hook_state is None:
        rec.attach_local(module, inner)
    else:
        rec.attach(hook_state, inner)
    return rec
