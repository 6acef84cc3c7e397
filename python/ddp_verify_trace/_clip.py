"""What the recorder learns by watching torch itself, patched once where every framework calls
it (Trainer through Accelerate, Lightning's precision plugins, plain loops):
- clip_grad_norm_ calls and the last one's norms: a recorded gradient is what the optimizer
  applies, after clipping, so a cause must know whether a clip ran and how hard;
- DistributedSampler.set_epoch calls (and AccumulationBatchSampler's): where epochs start, so
  a mismatch that starts in a later epoch can be named as a sampler's epoch;
- GradScaler.step: the loss scale each step ran at, and the steps it skipped (inf/NaN found),
  which never reach optimizer.step() and so are recorded from here;
- DistributedDataParallel's end of forward: whether each micro-batch's backward would be
  all-reduced (DDP decides there, from require_backward_grad_sync), so a rank's unsynced
  gradient can be traced to the micro-batch that ran without the all-reduce."""
import torch
import torch.nn.utils
import torch.nn.utils.clip_grad


class Clips:
    def __init__(self):
        self.calls = 0
        # [total norm before clipping, max_norm]
        self.last = [0.0, 0.0]
        # The epochs set so far, in order (each set_epoch call's argument).
        self.epochs = []
        # The loss scale of the GradScaler.step under way (None outside one), and what to
        # call when it skips the optimizer's step: (optimizer, scale) -> None.
        self.scale = None
        self.on_skip = None
        # Per DDP forward with grad enabled, in order: would its backward be all-reduced?
        self.ddp_syncs = []


def epoch_started(epoch):
    install().epochs.append(epoch)


_STATE = None


def install():
    global _STATE
    if _STATE is not None:
        return _STATE
    _STATE = Clips()
    original = torch.nn.utils.clip_grad.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        total = original(parameters, max_norm, *args, **kwargs)
        _STATE.calls += 1
        _STATE.last = [float(total), float(max_norm)]
        return total

    clip_grad_norm_.__wrapped__ = original
    clip_grad_norm_.__doc__ = original.__doc__
    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
    torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_

    from torch.utils.data import DistributedSampler

    set_epoch = DistributedSampler.set_epoch

    def distributed_set_epoch(self, epoch):
        set_epoch(self, epoch)
        _STATE.epochs.append(epoch)

    DistributedSampler.set_epoch = distributed_set_epoch

    from torch.amp import GradScaler

    scaler_step = GradScaler.step

    def step(self, optimizer, *args, **kwargs):
        if not self.is_enabled():
            return scaler_step(self, optimizer, *args, **kwargs)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STATE.scale = float(self.get_scale())
        stepped = []
        handle = register_optimizer_step_post_hook(lambda o, a, k: stepped.append(o))
        try:
            out = scaler_step(self, optimizer, *args, **kwargs)
            if not any(o is optimizer for o in stepped) and _STATE.on_skip is not None:
                _STATE.on_skip(optimizer, _STATE.scale)
        finally:
            handle.remove()
            _STATE.scale = None
        return out

    GradScaler.step = step

    from torch.nn.parallel import DistributedDataParallel

    post_forward = DistributedDataParallel._post_forward

    def _post_forward(self, output):
        if torch.is_grad_enabled():
            _STATE.ddp_syncs.append(bool(self.require_backward_grad_sync))
        return post_forward(self, output)

    DistributedDataParallel._post_forward = _post_forward
    return _STATE
