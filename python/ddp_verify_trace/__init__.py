"""Records what `ddp-verify compare A B` needs from your own PyTorch training loop.

Record the gradient-accumulation run and the DDP run of one model with one recorder each,
then compare the two files:

    rec = TraceRecorder(model, "out/ddp.safetensors")   # the module or its DDP wrapper
    ...
        rec.step()          # right before optimizer.step()
        optimizer.step()
    rec.close()             # final weights and buffers; writes the file (rank 0 only)

File layout (safetensors, format "ddp-verify-trace/1"): `grads.<step>.<param>`,
`scale.<step>.<param>`, `peak.<param>`, `final.<param>`, `buffer.<name>` and a string header.
"""
import os

import torch
import torch.distributed as dist
from safetensors.torch import save_file

__all__ = ["TraceRecorder"]
__version__ = "0.1.0"

FORMAT = "ddp-verify-trace/1"
# The float dtypes ddp-verify reads, by the names its --dtype uses.
DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _rank_world():
    """(rank, world size). Before init_process_group (or after its destroy) torchrun's RANK
    still says which process is rank 0, so only one of them ever touches the file."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), 1


def _host(t):
    """A detached contiguous CPU copy: never a view of a tensor training goes on changing."""
    return t.detach().to("cpu", copy=True).contiguous()


class TraceRecorder:
    """Records each optimizer step's gradients, the weights' peaks, the final weights and
    buffers of one run; every rank calls step() and close(), rank 0 alone writes `path`.
    Construct it once the model is on its device (it keeps the peaks there).

    magnitudes: also record `scale.<step>.<param>`, the sum of |micro-batch gradient| behind
      each step's gradient, which rounding differences are relative to where terms cancel.
    acc_steps, steps_per_epoch: stored in the header when given, for the report.
    """

    def __init__(self, model, path, *, overwrite=False, magnitudes=True, acc_steps=None, steps_per_epoch=None):
        # DDP's wrapper adds `module.` to every name; record the names of the model itself.
        self._module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        self.path = os.fspath(path)
        self._params = [(n, p) for n, p in self._module.named_parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("TraceRecorder: the model has no parameters that require grad; nothing to record")
        dtypes = sorted({str(p.dtype) for _, p in self._params})
        if len(dtypes) > 1:
            raise ValueError(
                f"TraceRecorder: the parameters mix dtypes ({', '.join(dtypes)}); a trace holds one float "
                "dtype, so cast the model to one (model.to(dtype)) before recording"
            )
        self._dtype = self._params[0][1].dtype
        if self._dtype not in DTYPES:
            raise ValueError(f"TraceRecorder: parameters are {self._dtype}; ddp-verify reads {', '.join(DTYPES.values())}")
        self._extra = {}
        for key, value in (("acc_steps", acc_steps), ("steps_per_epoch", steps_per_epoch)):
            if value is not None:
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ValueError(f"TraceRecorder: {key} must be a positive int, not {value!r}")
                self._extra[key] = str(value)
        rank, self._world = _rank_world()
        if rank == 0 and not overwrite and os.path.exists(self.path):
            raise FileExistsError(f"{self.path} exists: pass overwrite=True to replace it, or remove it")

        self._magnitudes = magnitudes
        self._tensors = {}
        self._steps = 0
        self._state = "open"
        # Peaks start from the initial weights: SGD rounds a weight at the largest size it took.
        self._peaks = {n: p.detach().abs() for n, p in self._params}
        # Magnitudes add up in at least float32, so that many half-precision terms keep their sum.
        self._acc_dtype = torch.promote_types(self._dtype, torch.float32)
        self._sums = {}  # name -> sum of |gradient| of each backward since the last step()
        self._hooks = [p.register_hook(self._summer(n)) for n, p in self._params] if magnitudes else []

    def _summer(self, name):
        # A tensor hook on a leaf sees each backward's own gradient before it is added to .grad
        # (under DDP: this rank's, before the all-reduce; under no_sync too).
        def hook(grad):
            g = grad.detach().abs().to(self._acc_dtype)
            total = self._sums.get(name)
            self._sums[name] = g if total is None else total.add_(g)

        return hook

    def _check_open(self, what):
        if self._state != "open":
            raise RuntimeError(f"TraceRecorder({self.path!r}): {what} called after the recorder was {self._state}")

    def _track_peaks(self):
        for n, p in self._params:
            torch.maximum(self._peaks[n], p.detach().abs(), out=self._peaks[n])

    def _reduced_sums(self):
        """Each parameter's magnitude sum, averaged over ranks as DDP averages gradients.
        Every rank makes the same all_reduce (zeros where no backward reached a parameter)."""
        sums = {n: self._sums.pop(n, None) for n, _ in self._params}
        sums = {n: torch.zeros_like(p, dtype=self._acc_dtype) if sums[n] is None else sums[n] for n, p in self._params}
        _, world = _rank_world()
        if world > 1:
            flat = torch.cat([s.reshape(-1) for s in sums.values()])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(world)
            parts = flat.split([s.numel() for s in sums.values()])
            sums = {n: part.view(s.shape) for (n, s), part in zip(sums.items(), parts)}
        return sums

    def step(self):
        """Call right before optimizer.step(), on every rank: records the gradients it applies."""
        self._check_open("step()")
        _, world = _rank_world()
        self._world = max(self._world, world)
        self._track_peaks()
        sums = self._reduced_sums() if self._magnitudes else {}
        s = self._steps
        for n, p in self._params:
            if p.grad is None:  # no gradient: the optimizer leaves this parameter alone
                continue
            self._tensors[f"grads.{s}.{n}"] = _host(p.grad)
            if self._magnitudes:
                self._tensors[f"scale.{s}.{n}"] = _host(sums[n].to(p.grad.dtype))
        self._steps += 1

    def close(self):
        """Records the final weights and buffers and writes the file (rank 0 only); on every rank."""
        self._check_open("close()")
        self._finish("closed")
        self._track_peaks()
        for n, p in self._params:
            self._tensors[f"peak.{n}"] = _host(self._peaks[n])
            self._tensors[f"final.{n}"] = _host(p)
        for n, b in self._module.named_buffers():
            self._tensors[f"buffer.{n}"] = _host(b)
        meta = {
            "format": FORMAT,
            "run": "ddp" if self._world > 1 else "single",
            "world_size": str(self._world),
            "dtype": DTYPES[self._dtype],
            "torch_version": torch.__version__,
            "steps": str(self._steps),
            "magnitudes": "true" if self._magnitudes else "false",
            **self._extra,
        }
        if _rank_world()[0] == 0:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            # Written aside, then renamed: a crash never leaves a half-written trace at `path`.
            part = self.path + ".part"
            save_file(self._tensors, part, metadata=meta)
            os.replace(part, self.path)
        self._tensors = {}

    def _finish(self, state):
        self._state = state
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # A run that raised is no run to compare: nothing is written.
        if self._state == "open":
            if exc_type is None:
                self.close()
            else:
                self._finish("abandoned by an exception in its with block")
        return False
