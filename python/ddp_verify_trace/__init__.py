"""Records what `ddp-verify compare` needs from your own PyTorch training: one line, or none.

One line, anywhere before training (any loop: plain, Transformers Trainer, Lightning,
Accelerate, Colossal-AI; it records at every real optimizer step, after accumulation and
the all-reduce, on every rank, and rank 0 writes the file when the script ends):

    import ddp_verify_trace; ddp_verify_trace.record("out/ddp.safetensors")

None: `ddp-verify --acc-steps K --gpus W -- python train.py ARGS` runs the script as both
legs with this hook loaded (`ddp_verify_trace.auto`).

By hand, where a loop wants to say when (the recorder of earlier versions):

    rec = TraceRecorder(model, "out/ddp.safetensors", optimizer=optimizer)
    ...
        rec.step()          # right before optimizer.step()
        optimizer.step()
    rec.close()             # final weights and buffers; writes the file (rank 0 only)

File layout: see `recorder.py`. `DistributedSamplerMimic` deals one process the samples W
ranks of DistributedSampler would see, step by step.
"""
import os

from .hook import Session
from .recorder import Recorder, rank_world, unwrap
from .sampler import AccumulationBatchSampler, accumulation_order

__all__ = [
    "TraceRecorder",
    "record",
    "recording",
    "AccumulationBatchSampler",
    "accumulation_order",
    "TrainerCallback",
    "LightningCallback",
]
__version__ = "0.2.0"

_SESSION = None


def _check_int(key, value):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"ddp_verify_trace: {key} must be a positive int, not {value!r}")
    return value


def _header(acc_steps, steps_per_epoch):
    meta = {}
    for key, value in (("acc_steps", acc_steps), ("steps_per_epoch", steps_per_epoch)):
        if _check_int(key, value) is not None:
            meta[key] = str(value)
    return meta


def record(path, *, model=None, overwrite=False, magnitudes=None, acc_steps=None, steps_per_epoch=None):
    """Records this process's training to `path` from now on, with no other change to the
    script. `model`: only where the optimizer's parameters are held by several modules that
    are not wrappers of one another. `acc_steps`: K over all ranks, for the report.
    `magnitudes`: what rounding is measured at where micro-batch gradients cancel: "tensor"
    (the default: each backward's largest |gradient| per tensor, one read pass), "element"
    (the sum of |micro-batch gradient| per element, a copy per backward: finer, dearer; see
    bench/recorder.py) or False; DDP_VERIFY_MAGNITUDES overrides the default."""
    if magnitudes is None:
        magnitudes = {"0": False, "false": False}.get(os.environ.get("DDP_VERIFY_MAGNITUDES", "tensor"),
                                                      os.environ.get("DDP_VERIFY_MAGNITUDES", "tensor"))
    global _SESSION
    if _SESSION is not None and _SESSION.recorder is not None and _SESSION.recorder.state == "open":
        raise RuntimeError(f"ddp_verify_trace: already recording to {_SESSION.path}")
    _SESSION = Session(path, overwrite=overwrite, magnitudes=magnitudes, meta=_header(acc_steps, steps_per_epoch), model=model)
    return _SESSION.start()


def recording(path, **kwargs):
    """`with recording(path): train()`: records the steps inside, writes the file at the end
    (nothing if the block raises)."""
    return record(path, **kwargs)


class TraceRecorder:
    """Records each optimizer step's gradients, the weights' peaks, the final weights and
    buffers of one run, where the loop calls `step()` right before `optimizer.step()`.
    Construct it once the model is on its device (it keeps the peaks there).

    optimizer: records each step's learning rates and the settings the final weights' bound
      needs (AdamW's betas and eps).
    magnitudes: also record `scale.<step>.<param>`, the sum of |micro-batch gradient| behind
      each step's gradient, which rounding differences are relative to where terms cancel.
    acc_steps, steps_per_epoch: stored in the header when given, for the report.
    """

    def __init__(
        self, model, path, *, optimizer=None, overwrite=False, magnitudes=True, acc_steps=None, steps_per_epoch=None
    ):
        self._optimizer = optimizer
        self._rec = Recorder(model, path, overwrite=overwrite, magnitudes=magnitudes, meta=_header(acc_steps, steps_per_epoch))
        self.path = self._rec.path

    def step(self):
        """Call right before optimizer.step(), on every rank: records the gradients it applies."""
        self._rec.check_open("step()")
        self._rec.track_peaks()
        self._rec.step(self._optimizer)

    def close(self):
        """Records the final weights and buffers and writes the file (rank 0 only); on every rank."""
        self._rec.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # A run that raised is no run to compare: nothing is written.
        if self._rec.state == "open":
            if exc_type is None:
                self.close()
            else:
                self._rec.finish("abandoned by an exception in its with block")
        return False


def __getattr__(name):
    # Framework callbacks subclass the framework's own class: built on first use, so the
    # package imports without them.
    if name in ("TrainerCallback", "LightningCallback"):
        from . import frameworks

        return getattr(frameworks, name)
    raise AttributeError(name)
