"""What the recorder learns by watching torch itself, patched where every framework calls it
(Trainer through Accelerate, Lightning's precision plugins, plain loops):
- clip_grad_norm_ calls and the last one's norms: a recorded gradient is what the optimizer
  applies, after clipping, so a cause must know whether a clip ran and how hard;
- DistributedSampler.set_epoch calls (and AccumulationBatchSampler's): where epochs start, so
  a mismatch that starts in a later epoch can be named as a sampler's epoch;
- GradScaler.step: the loss scale each step ran at, and the steps it skipped (inf/NaN found),
  which never reach optimizer.step() and so are recorded from here;
- Optimizer.__init__: the optimizers built once recording started, whose gradients
  `record()` must see before its first step says which one it follows;
- each engine's own points (`engines/`: where it decides or ends a reduction) and each
  framework's (`frameworks/`), through `Patches`: whether each micro-batch's
  gradient was reduced, the gradient collectives and their bytes, the divide factor and
  the compute dtype;
- destroy_process_group: an engine that gathers at the end does so before it goes.

Each recording opens a `Watch`, which sees only what happens while it is open. The patches
go in when the first watch opens and come out when the last one closes: torch is left with
the very objects it had, except where something else patched over them since (left alone,
the patch under it passing every call through)."""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad

from . import _deal, _outer, _owners, _patches
from ._patches import Patches
from ._stages.batches import Batches
from ._stages.local_sums import LocalSums


class Watch:
    """One recording's share of what the patches see, from when it opened."""

    def __init__(self) -> None:
        self.clip_calls = 0  # clip_grad_norm_ calls not yet taken by a step
        self.last_clip = [0.0, 0.0]  # [total norm before clipping, max_norm] of the last one
        # The loss scale of the GradScaler.step under way (None outside one), and what to
        # call when it skips the optimizer's step: (optimizer, scale) -> None.
        self.scale: float | None = None
        self.on_skip: Callable[[torch.optim.Optimizer, float], None] | None = None
        # Called with each optimizer built while set.
        self.on_optimizer: Callable[[torch.optim.Optimizer], None] | None = None
        # Two distinct epochs are all a recorder asks of set_epoch (did a second one start?),
        # so the log stays this small however long the run.
        self._epochs: set[Any] = set()
        self._syncs: list[bool] = []  # per micro-batch (DDP's forward): to be reduced?
        # Per parameter group of an engine that reduces by group: per backward,
        # whether it reduced its gradients.
        self._groups: dict[int, list[bool]] = {}
        self._comm = [0, 0]  # gradient collectives and their bytes since the last take
        # Which engine synchronised gradients (its header word), the divide factor it ran
        # with (None: its default) and the compute dtype where it casts the parameters.
        self.engine: str | None = None
        self.divide: float | None = None
        self.compute_dtype: torch.dtype | None = None
        # Called once before the default process group is destroyed (an engine's
        # parts of the weights can be gathered only while it lives).
        self.on_destroy: Callable[[], None] | None = None
        # Stage facts (`_stages`): each micro-batch's samples and loss on its way to backward,
        # each backward's own gradient before any reduction (by parameter identity, named by
        # the recorder at the step), and the step calls a framework's optimizer wrapper passed through.
        self.batches = Batches()
        self.local = LocalSums()
        # Tensor hooks summing each backward's own gradient, one per parameter (by id), put on
        # every outermost module's parameters from its first forward: the first step's too,
        # before a recorder knows the model.
        self._local_hooked: set[int] = set()
        self._local_modules: set[int] = set()
        self._local_handles: dict[int, Any] = {}  # by parameter id
        self.local_hooks = True  # False once the run's engine hands the watch its own
        self.wrapper_calls = 0
        self.framework_accumulation: int | None = None
        self.zeroed_in_window = 0  # zero_grad calls after a backward of the step, before it
        self.zeroed_by: str | None = None
        self.boundary_by: str | None = None  # who marked an engine's accumulation boundary by hand
        # How samplers and loaders dealt the data (`_deal`), by header key, this rank's.
        self.deal: dict[str, Any] = {}

    def dealt(self, facts: dict[str, Any]) -> None:
        """How the data was dealt (the first epoch's, per key): see `_deal`."""
        for k, v in facts.items():
            self.deal.setdefault(k, v)

    def zeroed(self, who: str) -> None:
        self.zeroed_in_window += 1
        self.zeroed_by = who

    def hook_local(self, module: torch.nn.Module) -> None:
        """Sums each backward's own gradient of `module`'s parameters (once per module and
        parameter): a tensor hook sees it before any reduction, under DDP and no_sync alike."""
        if id(module) in self._local_modules or not self.local_hooks:
            return
        self._local_modules.add(id(module))
        for p in module.parameters():
            if p.requires_grad and id(p) not in self._local_hooked:
                self._local_hooked.add(id(p))
                key = id(p)
                self._local_handles[key] = p.register_hook(lambda g, key=key: self.local.add(key, g))

    def unhook_local(self, ids: set[int]) -> None:
        """A recorder's own tensor hooks on these parameters add their local sums from now
        on (one hook per parameter instead of two, each a Python call per backward)."""
        for key in ids & self._local_handles.keys():
            self._local_handles.pop(key).remove()

    def no_local_hooks(self) -> None:
        """The run's engine hands the watch each local gradient itself (`local_grad`), or
        none is wanted (one process: the judge reads them from the applied gradients)."""
        self.local_hooks = False
        for h in self._local_handles.values():
            h.remove()
        self._local_handles = {}

    def local_grad(self, param: Any, grad: torch.Tensor) -> None:
        """An engine's own point before it reduces: `grad` is this rank's for `param`."""
        self.local.add(id(param), grad)

    def wrapper_step(self, accumulation: int | None) -> None:
        """The script called a framework's optimizer wrapper's step (which may or may not
        step the optimizer inside), told to accumulate `accumulation` micro-batches."""
        self.wrapper_calls += 1
        if accumulation is not None:
            self.framework_accumulation = accumulation

    def take_wrapper_calls(self) -> int:
        calls, self.wrapper_calls = self.wrapper_calls, 0
        return calls

    def epoch_started(self, epoch: Any) -> None:
        if len(self._epochs) < 2:
            self._epochs.add(epoch)

    def several_epochs(self) -> bool:
        """Whether a second epoch was set since this watch opened."""
        return len(self._epochs) > 1

    def clipped(self, total: float, max_norm: float) -> None:
        self.clip_calls += 1
        self.last_clip = [total, max_norm]

    def take_clips(self) -> tuple[int, list[float]]:
        """The clips since the last take, and the last clip's norms."""
        calls, self.clip_calls = self.clip_calls, 0
        return calls, self.last_clip

    def reduced(self, flag: bool, group: int | None = None) -> None:
        """One micro-batch's gradient was (`flag`) or was not reduced: as a whole (DDP's
        forward), or by parameter `group`, each group's backwards in turn."""
        if group is None:
            self._syncs.append(flag)
        else:
            self._groups.setdefault(group, []).append(flag)

    def take_syncs(self) -> list[bool]:
        """The micro-batches since the last take, each reduced or not (by any group)."""
        syncs, self._syncs = self._syncs, []
        if self._groups:
            groups, self._groups = list(self._groups.values()), {}
            n = max(len(g) for g in groups)
            syncs += [any(g[i] for g in groups if i < len(g)) for i in range(n)]
        return syncs

    def take_comm(self) -> tuple[int, int]:
        """Gradient collectives since the last take, and their bytes (one rank's share)."""
        comm, self._comm = self._comm, [0, 0]
        return comm[0], comm[1]

    def synced(self, engine: str, collectives: int, nbytes: int) -> None:
        self.engine = engine
        self._comm[0] += collectives
        self._comm[1] += nbytes

    def close(self) -> None:
        """Sees nothing more; the last watch to close takes the patches out."""
        for h in self._local_handles.values():
            h.remove()
        self._local_handles = {}
        if self in _OPEN:
            _OPEN.remove(self)
            if not _OPEN:
                _patches.undo()


_OPEN: list[Watch] = []


def open_watch() -> Watch:
    if not _OPEN:
        _patch_all()
    watch = Watch()
    _OPEN.append(watch)
    return watch


def dealt(facts: dict[str, Any]) -> None:
    """Noted by the open watches, if any; patches nothing (our own sampler calls it)."""
    for watch in _OPEN:
        watch.dealt(facts)


def epoch_started(epoch: Any) -> None:
    """An epoch set by a sampler torch does not know (AccumulationBatchSampler): noted by
    the open watches, if any; patches nothing."""
    for watch in _OPEN:
        watch.epoch_started(epoch)


def _patch_all() -> None:
    from torch.amp import GradScaler
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import BatchSampler, DistributedSampler

    clip_grad_norm = torch.nn.utils.clip_grad.clip_grad_norm_

    def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        total = clip_grad_norm(parameters, max_norm, *args, **kwargs)
        for watch in _OPEN:
            watch.clipped(float(total), float(max_norm))
        return total

    # One wrapper at both names, so a call through either is counted once.
    _patches.replace(torch.nn.utils.clip_grad, "clip_grad_norm_", clip_grad_norm_)
    _patches.replace(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)

    set_epoch = DistributedSampler.set_epoch

    def distributed_set_epoch(self: DistributedSampler, epoch: int) -> None:
        set_epoch(self, epoch)
        epoch_started(epoch)

    _patches.replace(DistributedSampler, "set_epoch", distributed_set_epoch)

    # How each epoch's samples are dealt: DistributedSampler's padding or dropping, a
    # loader's short or dropped last batch. Noted, never changed; a fact that cannot be
    # read is left out.
    sampler_iter = DistributedSampler.__iter__

    def distributed_iter(self: DistributedSampler) -> Any:
        out = sampler_iter(self)
        if _OPEN:
            try:
                dealt(_deal.sampler(self))
            except Exception:
                pass
        return out

    _patches.replace(DistributedSampler, "__iter__", distributed_iter)

    batch_iter = BatchSampler.__iter__

    def batches(self: BatchSampler) -> Any:
        if _OPEN:
            try:
                dealt(_deal.loader(len(self.sampler), self.batch_size, self.drop_last))  # type: ignore[arg-type]
            except Exception:
                pass
        return batch_iter(self)

    _patches.replace(BatchSampler, "__iter__", batches)

    def shard_facts(module: Any) -> None:
        shard_iter = module.BatchSamplerShard.__iter__

        def shard_batches(self: Any) -> Any:
            if _OPEN:
                try:
                    dealt(_deal.shard(self))
                except Exception:
                    pass
            return shard_iter(self)

        _patches.replace(module.BatchSamplerShard, "__iter__", shard_batches)

    _patches.after_import("accelerate.data_loader", shard_facts)

    # torch.cuda.amp.GradScaler inherits this step.
    scaler_step = GradScaler.step

    def step(self: GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        watches = list(_OPEN)
        if not self.is_enabled() or not watches:
            return scaler_step(self, optimizer, *args, **kwargs)
        scale = float(self.get_scale())
        stepped: list[torch.optim.Optimizer] = []
        handle = register_optimizer_step_post_hook(lambda o, a, k: stepped.append(o))
        for watch in watches:
            watch.scale = scale
        try:
            out = scaler_step(self, optimizer, *args, **kwargs)
            if not any(o is optimizer for o in stepped):
                for watch in watches:
                    if watch.on_skip is not None:
                        watch.on_skip(optimizer, scale)
        finally:
            handle.remove()
            for watch in watches:
                watch.scale = None
        return out

    _patches.replace(GradScaler, "step", step)

    _patch_destroy()
    _patch_stages()
    # Each engine's and framework's own points, through the one interface they share.
    from . import engines, frameworks

    engines.patch(PATCHES)
    frameworks.patch(PATCHES)

    optimizer_init = torch.optim.Optimizer.__init__

    def __init__(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        optimizer_init(self, *args, **kwargs)
        for watch in list(_OPEN):
            if watch.on_optimizer is not None:
                watch.on_optimizer(self)

    _patches.replace(torch.optim.Optimizer, "__init__", __init__)


# What engines and frameworks patch torch through.
PATCHES = Patches(watches=lambda: list(_OPEN))


def _patch_destroy() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    destroy = dist.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        if group is None:
            for watch in list(_OPEN):
                call, watch.on_destroy = watch.on_destroy, None
                if call is not None:
                    call()
        return destroy(group)

    # One wrapper at both names, as for clip_grad_norm_.
    _patches.replace(dist, "destroy_process_group", destroy_process_group)
    _patches.replace(dist.distributed_c10d, "destroy_process_group", destroy_process_group)


# The outermost module calls (`_outer`): the class patch until the first optimizer step,
# the modules' own hooks after it.
_OUTERMOST = _outer.Outer(lambda: list(_OPEN))


def _patch_stages() -> None:
    """The stage facts' points: every outermost module call with trainable parameters under
    grad mode (`_outer`), and every backward (its root and who called it)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    call = torch.nn.Module.__call__
    outer = _OUTERMOST

    def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # Inner calls, and every call once the modules carry their own hooks, pass straight through.
        if outer.depth or not outer.learning:
            return call(self, *args, **kwargs)
        trained = outer.enter(self, args, kwargs, sys._getframe(1))
        if trained is None:
            return call(self, *args, **kwargs)
        out = None
        try:
            out = call(self, *args, **kwargs)
        finally:
            outer.leave(trained, out)
        return out

    unpatch_call = _patches.replace(torch.nn.Module, "__call__", __call__)

    def learned(optimizer: Any, args: Any, kwargs: Any) -> None:
        if outer.learning and outer.learned():
            unpatch_call()

    handle = register_optimizer_step_post_hook(learned)
    _patches.on_undo(handle.remove)
    _patches.on_undo(outer.reset)

    backward = torch.autograd.backward

    def autograd_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        root = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
        if _OPEN and isinstance(root, torch.Tensor) and root.numel() == 1 and root.grad_fn is not None:
            try:
                who = _owners.caller(sys._getframe(1))
                for watch in list(_OPEN):
                    watch.batches.backward(root, who)
            except Exception:  # noqa: BLE001 - a fact not taken; the backward goes on
                pass
        return backward(tensors, *args, **kwargs)

    _patches.replace(torch.autograd, "backward", autograd_backward)

    # Gradients zeroed inside an accumulation window (after a backward, before the step):
    # the micro-batches before it are lost, and whose code did it is the owner.
    for owner in (torch.optim.Optimizer, torch.nn.Module):
        _patches.replace(owner, "zero_grad", _zeroing(owner.zero_grad))


def _zeroing(zero_grad: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        for watch in list(_OPEN):
            if watch.batches.rows:
                try:
                    watch.zeroed(_owners.caller(sys._getframe(1)))
                except Exception:  # noqa: BLE001 - a fact not taken; training goes on
                    pass
        return zero_grad(self, *args, **kwargs)

    return wrapper
