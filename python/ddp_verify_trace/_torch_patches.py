"""torch's patches: what the recorder learns by watching torch itself, patched where every
framework calls it (Trainer through Accelerate, Lightning's precision plugins, plain loops):
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
- destroy_process_group: an engine that gathers at the end does so before it goes;
- Module.__call__ until the first optimizer step (then the modules' own hooks: `_outermost`),
  autograd.backward, Optimizer.zero_grad and Module.zero_grad: the stage facts' points
  (`_stages`), each micro-batch's samples and loss and who called backward or zeroed;
- DistributedSampler.__iter__, BatchSampler.__iter__ (and Accelerate's BatchSamplerShard's):
  how the samples were dealt (`_deal`).
Two change the run, where ddp-verify asks (its environment): `--no-dropout` makes every
dropout the identity (`_no_dropout`), `--device cpu` runs a script's CUDA and NCCL on the CPU
with gloo (`_cpu_device`); they go in first, before the script runs, and their own refusal of
a wrong setting comes before anything is patched.

Each recording opens a `Watch` (`open_watch`), which sees only what happens while it is open.
The patches go in through the registry (`_patches`) when the first watch opens and come out
when the last one closes: torch is left with the very objects it had, except where something
else patched over them since (left alone, the patch under it passing every call through)."""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad

from . import _cpu_device, _deal, _divisor, _no_dropout, _outermost, _owners, _patches, engines, frameworks
from ._patches import Patches
from ._watch import OPEN, Watch, dealt, epoch_started

# What engines and frameworks patch through: the registry's, reaching the open watches.
PATCHES = Patches(watches=lambda: list(OPEN))


def open_watch() -> Watch:
    """A new watch; the first one open patches torch."""
    if not OPEN:
        _patch_all()
    watch = Watch()
    OPEN.append(watch)
    return watch


def _whole_norm(total: Any) -> float:
    """The total norm clip_grad_norm_ returned, over every rank's part: a norm of parameters
    split across ranks comes as a tensor whose float() reads this rank's partial norm alone,
    and `full_tensor` gathers it (every rank clips, so every rank gathers)."""
    full = getattr(total, "full_tensor", None)
    return float(full() if callable(full) else total)


def _patch_all() -> None:
    from torch.amp import GradScaler
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import BatchSampler, DistributedSampler

    _no_dropout.enabled(), _cpu_device.enabled()  # a wrong setting refused before any patch
    _no_dropout.patch()
    _cpu_device.patch()
    # The precision control (ddp-verify's, never a user's run): its backwards seeded by W.
    _divisor.start()
    _patches.on_undo(_divisor.stop)
    clip_grad_norm = torch.nn.utils.clip_grad.clip_grad_norm_

    def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        total = clip_grad_norm(parameters, max_norm, *args, **kwargs)
        if OPEN:
            norm = _whole_norm(total)
            for watch in OPEN:
                watch.clipped(norm, float(max_norm))
        return total

    # One wrapper at both names, so a call through either is counted once.
    _patches.replace(torch.nn.utils.clip_grad, "clip_grad_norm_", clip_grad_norm_)
    _patches.replace(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)
    # The clip in two calls (torch 2.6 on): the total norm, then the clip with it, as
    # Accelerate 1.16's clip_grad_norm_ does. Only the public name: clip_grad_norm_ calls the
    # module's own, so one clip is counted once.
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
        clip_with_norm = torch.nn.utils.clip_grads_with_norm_

        def clip_grads_with_norm_(parameters: Any, max_norm: float, total_norm: Any, *args: Any, **kwargs: Any) -> Any:
            out = clip_with_norm(parameters, max_norm, total_norm, *args, **kwargs)
            if OPEN:
                norm = _whole_norm(total_norm)
                for watch in OPEN:
                    watch.clipped(norm, float(max_norm))
            return out

        _patches.replace(torch.nn.utils, "clip_grads_with_norm_", clip_grads_with_norm_)

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
        if OPEN:
            try:
                dealt(_deal.sampler(self))
            except Exception:
                pass
        return out

    _patches.replace(DistributedSampler, "__iter__", distributed_iter)

    batch_iter = BatchSampler.__iter__

    def batches(self: BatchSampler) -> Any:
        if OPEN:
            try:
                dealt(_deal.loader(len(self.sampler), self.batch_size, self.drop_last))  # type: ignore[arg-type]
            except Exception:
                pass
        return batch_iter(self)

    _patches.replace(BatchSampler, "__iter__", batches)

    def shard_facts(module: Any) -> None:
        shard_iter = module.BatchSamplerShard.__iter__

        def shard_batches(self: Any) -> Any:
            if OPEN:
                try:
                    dealt(_deal.shard(self))
                except Exception:
                    pass
            return shard_iter(self)

        _patches.replace(module.BatchSamplerShard, "__iter__", shard_batches)

    _patches.after_import("accelerate.data_loader", shard_facts)

    def patch_scaler() -> None:
        # torch.cuda.amp.GradScaler inherits this step.
        scaler_step = GradScaler.step

        def step(self: GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            watches = list(OPEN)
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

    _patches.attempt("GradScaler.step", patch_scaler)

    _patches.attempt("destroy_process_group", _patch_destroy)
    _patches.attempt("the stage facts' points", _patch_stages)
    # Each engine's and framework's own points, through the one interface they share.
    _patches.attempt("the engines' points", lambda: engines.patch(PATCHES))
    _patches.attempt("the frameworks' points", lambda: frameworks.patch(PATCHES))

    optimizer_init = torch.optim.Optimizer.__init__

    def __init__(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        optimizer_init(self, *args, **kwargs)
        for watch in list(OPEN):
            if watch.on_optimizer is not None:
                watch.on_optimizer(self)

    _patches.replace(torch.optim.Optimizer, "__init__", __init__)


def _patch_destroy() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    destroy = dist.destroy_process_group

    def destroy_process_group(group: Any = None) -> None:
        if group is None:
            for watch in list(OPEN):
                call, watch.on_destroy = watch.on_destroy, None
                if call is not None:
                    call()
        return destroy(group)

    # One wrapper at both names, as for clip_grad_norm_.
    _patches.replace(dist, "destroy_process_group", destroy_process_group)
    _patches.replace(dist.distributed_c10d, "destroy_process_group", destroy_process_group)


# The outermost module calls (`_outermost`): the class patch until the first optimizer step,
# the modules' own hooks after it.
_OUTERMOST = _outermost.Outer(lambda: list(OPEN))


def _patch_stages() -> None:
    """The stage facts' points: every outermost module call with trainable parameters under
    grad mode (`_outermost`), and every backward (its root and who called it)."""
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

    # An autocast entered inside an outermost forward (Accelerate's prepared forward enters
    # its own, where the script's loop shows none): that forward's precision.
    from torch.amp.autocast_mode import autocast

    enter_autocast = autocast.__enter__

    def __enter__(self: Any) -> Any:
        out = enter_autocast(self)
        if outer.depth and OPEN:
            try:
                outer.autocast_entered(self.fast_dtype if self._enabled else None)
            except Exception:  # noqa: BLE001 - a fact not taken; the forward goes on
                pass
        return out

    _patches.replace(autocast, "__enter__", __enter__)

    def learned(optimizer: Any, args: Any, kwargs: Any) -> None:
        if outer.learning and outer.learned():
            unpatch_call()

    handle = register_optimizer_step_post_hook(learned)
    _patches.on_undo(handle.remove)
    _patches.on_undo(outer.reset)

    backward = torch.autograd.backward

    def autograd_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        root = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
        if OPEN and isinstance(root, torch.Tensor) and root.numel() == 1 and root.grad_fn is not None:
            try:
                who = _owners.caller(sys._getframe(1))
                for watch in list(OPEN):
                    watch.batches.backward(root, who)
            except Exception:  # noqa: BLE001 - a fact not taken; the backward goes on
                pass
        control = _divisor.ACTIVE
        if control is not None and isinstance(root, torch.Tensor) and root.numel() == 1 and root.grad_fn is not None:
            if not args and kwargs.get("grad_tensors") is None:
                kwargs["grad_tensors"] = control.seed(root)
            elif args and args[0] is None:
                args = (control.seed(root), *args[1:])
        return backward(tensors, *args, **kwargs)

    _patches.replace(torch.autograd, "backward", autograd_backward)

    # Gradients zeroed inside an accumulation window (after a backward, before the step):
    # the micro-batches before it are lost, and whose code did it is the owner.
    for owner in (torch.optim.Optimizer, torch.nn.Module):
        _patches.replace(owner, "zero_grad", _zeroing(owner.zero_grad))


def _zeroing(zero_grad: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        for watch in list(OPEN):
            if watch.batches.rows:
                try:
                    watch.zeroed(_owners.caller(sys._getframe(1)))
                except Exception:  # noqa: BLE001 - a fact not taken; training goes on
                    pass
        return zero_grad(self, *args, **kwargs)

    return wrapper
