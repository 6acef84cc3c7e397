"""What the recorder learns by watching torch itself, patched once where every framework calls
it (Trainer through Accelerate, Lightning's precision plugins, plain loops):
- clip_grad_norm_ calls and the last one's norms: a recorded gradient is what the optimizer
  applies, after clipping, so a cause must know whether a clip ran and how hard;
- DistributedSampler.set_epoch calls (and AccumulationBatchSampler's): where epochs start, so
  a mismatch that starts in a later epoch can be named as a sampler's epoch."""
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
    return _STATE
