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

A recording patches a few torch functions to watch training (`_torch_patches`) and puts
every one back when it closes, is abandoned or the script exits (`_patches`). Wrong arguments
are refused at the call. File layout: see `recorder.py`. `AccumulationBatchSampler` deals one
process the samples W ranks of DistributedSampler would see, step by step. The modules stand
in layers, each importing only from those below it (docs/architecture.md, "The recorder").
"""
from __future__ import annotations

import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from . import callbacks
from ._args import Magnitudes, PathLike, Sample, env_magnitudes, header_meta, resolve_sample
from .accumulation_sampler import AccumulationBatchSampler, accumulation_order
from .frameworks import CALLBACKS
from .recorder import Recorder
from .session import Session

if TYPE_CHECKING:
    from .callbacks import DDPVerifyCallback, DDPVerifyLightningCallback, LightningCallback, TrainerCallback

__all__ = [
    "TraceRecorder",
    "record",
    "recording",
    "AccumulationBatchSampler",
    "accumulation_order",
    "DDPVerifyCallback",
    "DDPVerifyLightningCallback",
    # Deprecated aliases of the two above.
    "TrainerCallback",
    "LightningCallback",
]
__version__ = "0.2.0"

# The last record()'s session, while something else holds it (its hooks do while it records).
_SESSION: weakref.ref[Session] | None = None


def record(
    path: PathLike,
    *,
    model: torch.nn.Module | None = None,
    overwrite: bool = False,
    magnitudes: Magnitudes = None,
    acc_steps: int | None = None,
    steps_per_epoch: int | None = None,
    sample: Sample = None,
) -> Session:
    """Records this process's training to `path` from now on, with no other change to the
    script. `model`: only where the optimizer's parameters are held by several modules that
    are not wrappers of one another. `acc_steps`: K over all ranks, for the report.
    `magnitudes`: what rounding is measured at where micro-batch gradients cancel: "tensor"
    (the default: each backward's largest |gradient| per tensor, one read pass), "element"
    (the sum of |micro-batch gradient| per element, a copy per backward: finer, dearer; see
    bench/recorder.py) or False; DDP_VERIFY_MAGNITUDES overrides the default.
    `sample`: N, a positive int: of each parameter tensor of more than N elements keep N
    positions (the same in every run of the model: drawn from its name and shape), recording
    there each step's gradient and magnitudes (per element, whatever `magnitudes` says,
    unless False) and the final weights and peaks, plus the whole gradient's sum, sum of
    squares and max |g| in float64; smaller tensors and buffers whole (no tensor larger than N:
    a whole trace). A sampled trace holds about N x tensors x steps elements (x2 with
    magnitudes) plus 3 float64 per tensor per step, whatever the model's size. "full": every
    tensor whole. "auto": sampled at N = _schema.SAMPLE_SIZE (1024) where the recorded
    parameters number more than _schema.SAMPLE_FROM_PARAMETERS (4M), else whole. None (the
    default): DDP_VERIFY_SAMPLE (auto, full or N) where set, else "auto".

    Raises at the call where an argument is wrong (ValueError) or `path` exists without
    overwrite=True (FileExistsError); RuntimeError while an earlier record() records."""
    global _SESSION
    last = _SESSION() if _SESSION is not None else None
    if last is not None and last.recorder is not None and last.recorder.state == "open":
        raise RuntimeError(
            f"ddp_verify_trace: already recording to {last.path}: close that recording first "
            "(.close() on what record() returned)"
        )
    if magnitudes is None:
        magnitudes = env_magnitudes()
    sample = resolve_sample(sample)
    meta = header_meta(acc_steps, steps_per_epoch)
    session = Session(path, overwrite=overwrite, magnitudes=magnitudes, meta=meta, model=model, sample=sample)
    _SESSION = weakref.ref(session.start())
    return session


def recording(path: PathLike, **kwargs: Any) -> Session:
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
    sample: as record()'s: N positions kept per tensor of more than N elements (with each
      whole gradient's float64 sum, sum of squares and max |g| per step; a trace of about
      N x tensors x steps elements, x2 with magnitudes, however large the model), "full"
      (whole), "auto" (sampled above _schema.SAMPLE_FROM_PARAMETERS parameters), or None
      (the default): DDP_VERIFY_SAMPLE where set, else "auto".
    Wrong arguments raise here; torch is patched from here until close() (or the with block's end).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        path: PathLike,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        overwrite: bool = False,
        magnitudes: Magnitudes = True,
        acc_steps: int | None = None,
        steps_per_epoch: int | None = None,
        sample: Sample = None,
    ) -> None:
        self._optimizer = optimizer
        self._rec = Recorder(
            model,
            path,
            overwrite=overwrite,
            magnitudes=magnitudes,
            meta=header_meta(acc_steps, steps_per_epoch),
            sample=resolve_sample(sample),
        )
        self.path = self._rec.path

    def step(self) -> None:
        """Call right before optimizer.step(), on every rank: records the gradients it applies."""
        self._rec.check_open("step()")
        self._rec.track_peaks()
        self._rec.step(self._optimizer)

    def close(self) -> None:
        """Records the final weights and buffers and writes the file (rank 0 only); on every rank."""
        self._rec.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # A run that raised is no run to compare: nothing is written (and the exception goes on).
        if self._rec.state == "open":
            if exc_type is None:
                self.close()
            else:
                self._rec.finish("abandoned by an exception in its with block")


def __getattr__(name: str) -> Any:
    # Framework callbacks subclass the framework's own class: built on first use, so the
    # package imports without them.
    if name in CALLBACKS:
        return getattr(callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
