"""The recorder: what one run's optimizer steps applied, and everything around them that
decides whether two runs are the same training.

What a trace holds, tensor by tensor and header key by header key, is `_schema.py`,
generated from the tables `ddp-verify compare` reads by (src/evidence/schema.rs; its docs in
docs/architecture.md, "The trace schema"). Per optimizer step: the gradient it applied, the
micro-batches' magnitudes, the learning rates, backward passes, clip calls and the last
clip's norms, under DDP each rank's gradient checksum and each forward's sync flag, under a
GradScaler its scale and skips; once: the peaks, final weights and buffers, and a header
with the world size, the optimizer's kind and settings, the framework that called the step,
and the dropout layers that train (runs with dropout draw their own masks).
"""
from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Union

import torch
import torch.distributed as dist

from . import _schema, _watch
from ._stream import Stream

FORMAT = _schema.FORMAT
# The float dtypes ddp-verify reads, by the names its --dtype uses.
DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Integer views of each float dtype, for bit checksums.
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16, torch.float16: torch.int16}
# Optimizer settings the bound on final weights needs (AdamW carries a gradient's allowance).
_SETTINGS = _schema.OPTIMIZER_SETTINGS


def rank_world() -> tuple[int, int]:
    """(rank, world size). Before init_process_group (or after its destroy) torchrun's RANK
    still says which process is rank 0, so only one of them ever touches the file."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), 1


def _host(t: torch.Tensor) -> torch.Tensor:
    """A detached contiguous CPU copy: never a view of a tensor training goes on changing."""
    return t.detach().to("cpu", copy=True).contiguous()


def _owns_memory(g: torch.Tensor) -> bool:
    """A CPU tensor alone in its memory: no bucket view that DDP writes into again."""
    return g.device.type == "cpu" and g._base is None and g.is_contiguous() and (
        g.untyped_storage().nbytes() == g.numel() * g.element_size()
    )


def _bits(g: torch.Tensor) -> torch.Tensor:
    """A checksum of a tensor's bits, in one pass: equal gradients give equal sums, and a
    gradient part of which was never all-reduced differs in many elements, whose bit
    patterns do not cancel."""
    return g.detach().contiguous().view(_BITS[g.dtype]).sum(dtype=torch.int64)


def add_backward(sums: dict[Any, Any], counts: dict[Any, int], key: Any, grad: torch.Tensor, how: str | None) -> None:
    """One backward's gradient of one parameter: counted, and its magnitude added to `sums`
    per element (`how` "element") or as its largest |value| ("tensor"), in at least float32,
    so that many half-precision terms keep their sum."""
    counts[key] = counts.get(key, 0) + 1
    if not how:
        return
    if how == "tensor":
        # One read pass that allocates nothing the size of the tensor; the rest of the
        # arithmetic waits for the step, where it is done for every backward at once.
        sums.setdefault(key, []).append(torch.aminmax(grad.detach()))
        return
    g = grad.detach().abs().to(torch.promote_types(grad.dtype, torch.float32))
    total = sums.get(key)
    sums[key] = g if total is None else total.add_(g)


def _largest_sums(
    lists: list[list[tuple[torch.Tensor, torch.Tensor]]], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Per parameter, the sum over its backwards of max |gradient|, from their aminmax pairs,
    in a handful of operations for all of them."""
    index = torch.tensor([i for i, pairs in enumerate(lists) for _ in pairs], dtype=torch.int64, device=device)
    out = torch.zeros(len(lists), dtype=dtype, device=device)
    if len(index):
        lo = torch.stack([lo for pairs in lists for lo, _ in pairs])
        hi = torch.stack([hi for pairs in lists for _, hi in pairs])
        out.index_add_(0, index, torch.maximum(lo.neg_(), hi).to(dtype))
    return out


def _active_dropout(module: torch.nn.Module) -> str | None:
    """The dropout that trains (layers with p > 0 in training mode), in words, or None: runs
    with it draw their own masks, which compare must say before anything finer."""
    ps = [m.p for m in module.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0]
    return f"{len(ps)} dropout layers, p up to {max(ps):g}" if ps else None


def _framework() -> str:
    """Which framework called optimizer.step(), from the calling frames: it decides where
    clipping and loss division happen, so causes can name the right fix."""
    frame: FrameType | None = sys._getframe(2)
    seen: set[str] = set()
    while frame is not None:
        mod = frame.f_globals.get("__name__", "")
        for name, modules in _schema.FRAMEWORKS.items():
            if any(mod == m or mod.startswith(m + ".") for m in modules):
                seen.add(name)
        frame = frame.f_back
    # Transformers' Trainer steps through Accelerate: the outermost framework is the user's,
    # and the schema lists them outermost first.
    for name in _schema.FRAMEWORKS:
        if name in seen:
            return name
    return "plain"


def _setting(value: Any) -> str | None:
    """An optimizer setting as the header holds it: a number, a flag, or numbers separated by
    spaces (betas); None for what is none of these (a setting another optimizer spells
    otherwise), which the header then leaves out."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return str(value) if abs(float(value)) != float("inf") and value == value else None
    if isinstance(value, (tuple, list)) and value:
        parts = [_setting(v) for v in value]
        ok = all(p is not None and not isinstance(v, bool) for p, v in zip(parts, value))
        return " ".join(p for p in parts if p is not None) if ok else None
    return None


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The user's own module inside DDP's, Accelerate's, Colossal-AI's or torch.compile's
    wrappers: their names are what both runs share."""
    while True:
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module) and set(map(id, inner.parameters())) == set(
            map(id, module.parameters())
        ):
            module = inner
        else:
            return module


# What a trace's path may be given as.
PathLike = Union[str, "os.PathLike[str]"]
# magnitudes=: "element", "tensor", True ("element") or False/None (off).
Magnitudes = Union[str, bool, None]


def check_magnitudes(value: Magnitudes, what: str = "magnitudes") -> str | None:
    """`value` as the recorder keeps it ("element", "tensor" or None), or a ValueError now."""
    if value is True:
        return "element"
    if value is False or value is None:
        return None
    if isinstance(value, str) and value in ("element", "tensor"):
        return value
    raise ValueError(f"ddp_verify_trace: {what} must be 'element', 'tensor' or False, not {value!r}")


def check_path(path: PathLike, overwrite: bool) -> str:
    """`path` as a str, once rank 0 could write a trace there: refused now, at the call, not
    at the first optimizer step inside the user's training. Other ranks never touch it."""
    path = os.fspath(path)
    if not isinstance(path, str):
        raise ValueError(f"ddp_verify_trace: path must be a str or os.PathLike of str, not {path!r}")
    if rank_world()[0] != 0:
        return path
    if os.path.isdir(path):
        example = os.path.join(path, "trace.safetensors")
        raise ValueError(f"ddp_verify_trace: path {path} is a folder: pass a file's path, such as {example}")
    if not overwrite and os.path.exists(path):
        raise FileExistsError(f"{path} exists: pass overwrite=True to replace it, or remove it")
    # The folder is made at the first step where missing: its nearest existing part must allow it.
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"ddp_verify_trace: path {path} lies under {folder}, which is a file: pass a path under a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"ddp_verify_trace: path {path}: {folder} is not writable: pass a path in a folder you may write in")
    return path


class Recorder:
    """One run's record. `step()` takes the gradients as they are now; every rank calls it
    at every optimizer step, and `close()` at the end; rank 0 alone writes `path`."""

    def __init__(
        self,
        module: torch.nn.Module,
        path: PathLike,
        *,
        overwrite: bool = False,
        magnitudes: Magnitudes = True,
        meta: dict[str, str] | None = None,
        params: list[tuple[str, torch.nn.Parameter]] | None = None,
        watch: _watch.Watch | None = None,
    ) -> None:
        self._module = unwrap(module)
        self.path = check_path(path, overwrite)
        self._magnitudes = check_magnitudes(magnitudes)
        self._params = params or [(n, p) for n, p in self._module.named_parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("ddp_verify_trace: the model has no parameters that require grad; nothing to record")
        dtypes = sorted({str(p.dtype) for _, p in self._params})
        if len(dtypes) > 1:
            raise ValueError(
                f"ddp_verify_trace: the parameters mix dtypes ({', '.join(dtypes)}); a trace holds one float "
                "dtype, so cast the model to one (model.to(dtype)) before recording"
            )
        self._dtype = self._params[0][1].dtype
        if self._dtype not in DTYPES:
            raise ValueError(f"ddp_verify_trace: parameters are {self._dtype}; ddp-verify reads {', '.join(DTYPES.values())}")
        self._meta = dict(meta or {})
        dropout = _active_dropout(self._module)
        if dropout:
            self._meta["dropout"] = dropout
        self._world = rank_world()[1]
        # Opened by rank 0 at its first step, when the process group says which rank is 0.
        self._stream: Stream | None = None
        self._tensors: dict[str, torch.Tensor] = {}
        self._steps = 0
        self.state = "open"
        # Peaks start from the initial weights: SGD rounds a weight at the largest size it took.
        self._peaks = {n: p.detach().abs() for n, p in self._params}
        self._scratch: dict[str, torch.Tensor] = {}
        # Magnitudes add up in at least float32, so that many half-precision terms keep their sum.
        self._acc_dtype = torch.promote_types(self._dtype, torch.float32)
        self._sums: dict[str, Any] = {}  # name -> sum of |gradient| of each backward since the last step
        self._counts: dict[str, int] = {}  # name -> backward passes that reached it since the last step
        # Per parameter, whether the loop set its gradient to None after the last step (so the
        # step's gradient can be lent to the writer instead of copied: nothing changes it).
        self._nulled: dict[str, bool] = {}
        self._seen: set[str] = set()
        self._others: dict[int, str] = {}  # id -> class name of each other optimizer that stepped
        # Last, once nothing above can refuse: what torch's patched calls see from now on
        # (a `record()` session's watch, opened when it started, or one of this recorder's own).
        self._own_watch = watch is None
        self._watch = _watch.open_watch() if watch is None else watch
        self._hooks = [p.register_hook(self._summer(n, p)) for n, p in self._params]

    def _summer(self, name: str, param: torch.nn.Parameter) -> Any:
        # A tensor hook on a leaf sees each backward's own gradient before it is added to .grad
        # (under DDP: this rank's, before the all-reduce; under no_sync too).
        def hook(grad: torch.Tensor) -> None:
            if name not in self._seen and self._steps:
                self._seen.add(name)
                self._nulled[name] = param.grad is None
            # A gradient about to be added to in place may be one the writer still reads.
            if param.grad is not None and self._stream is not None and self._stream.busy():
                self._stream.settle()
            add_backward(self._sums, self._counts, name, grad, self._magnitudes)

        return hook

    def saw_other_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Another optimizer stepped: its parameters are not in this trace, and the report says so."""
        self._others[id(optimizer)] = type(optimizer).__name__

    def take_sums(self, sums: dict[str, Any], counts: dict[str, int]) -> None:
        """Magnitudes gathered before this recorder existed (the zero-edit hook's)."""
        self._sums.update(sums)
        self._counts.update(counts)

    @property
    def steps(self) -> int:
        """Optimizer steps recorded so far."""
        return self._steps

    def check_open(self, what: str) -> None:
        if self.state != "open":
            raise RuntimeError(f"ddp_verify_trace({self.path!r}): {what} called after the recorder was {self.state}")

    def track_peaks(self, later: bool = False) -> None:
        """|w| into the peaks. `later`: on the writer thread, from weights that nothing changes
        until the caller's `settle()` (the hooks settle before the next optimizer step)."""
        # Into a scratch buffer kept from step to step: a fresh one per step costs more in
        # page faults than the arithmetic. Rank 0's alone are written (DDP's weights agree).
        if rank_world()[0] != 0:
            return
        if later and self._stream is not None:
            self._stream.later(self._peaks_now)
        else:
            self._peaks_now()

    def settle(self) -> None:
        """Waits for the writer's work on the weights (before an optimizer step moves them)."""
        if self._stream is not None:
            self._stream.settle()

    def _peaks_now(self) -> None:
        for n, p in self._params:
            scratch = self._scratch.get(n)
            if scratch is None:
                scratch = self._scratch[n] = torch.empty_like(self._peaks[n])
            torch.abs(p.detach(), out=scratch)
            torch.maximum(self._peaks[n], scratch, out=self._peaks[n])

    def _reduced_sums(self, world: int) -> Any:
        """Each parameter's magnitude sum, averaged over ranks as DDP averages gradients.
        Every rank makes the same all_reduce (zeros where no backward reached a parameter)."""
        sums = {n: self._sums.pop(n, None) for n, _ in self._params}
        if self._magnitudes == "tensor":
            device = self._params[0][1].device
            flat = _largest_sums([sums[n] or [] for n, _ in self._params], self._acc_dtype, device)
            if world > 1:
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat.div_(world)
            return flat
        sums = {n: torch.zeros_like(p, dtype=self._acc_dtype) if sums[n] is None else sums[n] for n, p in self._params}
        if world > 1:
            flat = torch.cat([s.reshape(-1) for s in sums.values()])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(world)
            parts = flat.split([s.numel() for s in sums.values()])
            sums = {n: part.view(s.shape) for (n, s), part in zip(sums.items(), parts)}
        return sums

    def _rank_bits(self, world: int) -> torch.Tensor:
        """Every rank's checksum of every gradient, gathered on every rank (one all_gather)."""
        mine = torch.stack(
            [_bits(p.grad) if p.grad is not None else torch.zeros((), dtype=torch.int64, device=p.device) for _, p in self._params]
        )
        out = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(out, mine)
        return torch.stack([o.cpu() for o in out])  # [W, P]

    def step(self, optimizer: torch.optim.Optimizer | None = None, skipped: bool = False) -> None:
        """Records the gradients as they are now: the ones this optimizer step applies (or,
        `skipped`, the ones a GradScaler found inf/NaN in and did not apply)."""
        self.check_open("step()")
        scale = self._watch.scale
        if scale is not None:
            self._tensors[_schema.name("loss_scale", self._steps)] = torch.tensor([scale], dtype=torch.float32)
            self._tensors[_schema.name("found_inf", self._steps)] = torch.tensor([float(skipped)], dtype=torch.float32)
        # The first step after a second epoch was set: the steps before it made one epoch.
        if "steps_per_epoch" not in self._meta and self._steps and self._watch.several_epochs():
            self._meta["steps_per_epoch"] = str(self._steps)
        _, world = rank_world()
        self._world = max(self._world, world)
        sums: Any = self._reduced_sums(world) if self._magnitudes else {}
        s = self._steps
        micro = max(self._counts.values(), default=0)
        self._counts = {}
        self._tensors[_schema.name("micro", s)] = torch.tensor([micro], dtype=torch.int64)
        if optimizer is not None:
            lrs = [float(g["lr"]) for g in optimizer.param_groups]
            self._tensors[_schema.name("lr", s)] = torch.tensor(lrs, dtype=torch.float64)
            self._settings(optimizer)
        calls, last = self._watch.take_clips()
        self._tensors[_schema.name("clips", s)] = torch.tensor([calls], dtype=torch.int64)
        if calls:
            self._tensors[_schema.name("clip", s)] = torch.tensor(last, dtype=torch.float64)
        syncs = self._watch.take_syncs()
        if syncs:
            self._tensors[_schema.name("ddp_sync", s)] = torch.tensor(syncs, dtype=torch.int64)
            self._meta["ddp_forward"] = "seen"
        bits = self._rank_bits(world) if world > 1 else None
        # Only rank 0 writes: the others take part in the collectives above and keep nothing,
        # so they do not slow every DDP step with copies of their gradients.
        if rank_world()[0] != 0:
            self._tensors = {}
            self._steps += 1
            return
        big: list[tuple[str, torch.Tensor]] = []
        lent: list[tuple[str, torch.Tensor]] = []
        if self._magnitudes == "tensor":  # one small tensor for all parameters, split at close
            sums = dict(zip((n for n, _ in self._params), sums.to("cpu", self._dtype).unbind()))
        for i, (n, p) in enumerate(self._params):
            if p.grad is None:  # no gradient: the optimizer leaves this parameter alone
                continue
            grad = (_schema.name("grads", s, n), p.grad)
            (lent if self._nulled.get(n) and _owns_memory(p.grad) else big).append(grad)
            if self._magnitudes == "element":
                big.append((_schema.name("scale", s, n), sums[n].to(p.grad.dtype)))
            elif self._magnitudes:
                self._tensors[_schema.name("scale", s, n)] = sums[n]
            if bits is not None:
                self._tensors[_schema.name("rank_bits", s, n)] = bits[:, i].contiguous()
        self._open().put(big, lent)
        self._keep()
        self._steps += 1
        self._seen = set()

    def _open(self) -> Stream:
        if self._stream is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._stream = Stream(self.path)
        return self._stream

    def _keep(self) -> None:
        for name, t in self._tensors.items():
            self._open().keep(name, t)
        self._tensors = {}

    def _settings(self, optimizer: torch.optim.Optimizer) -> None:
        if "optimizer" in self._meta:
            return
        group = optimizer.param_groups[0]
        self._meta["optimizer"] = type(optimizer).__name__
        for key in _SETTINGS:
            value = _setting(group.get(key))
            if value is not None:
                self._meta[key] = value

    def close(self) -> None:
        """Records the final weights and buffers and writes the file (rank 0 only)."""
        self.check_open("close()")
        self.finish("closed")
        self.settle()
        self.track_peaks()
        for n, p in self._params:
            self._tensors[_schema.name("peak", param=n)] = _host(self._peaks[n])
            self._tensors[_schema.name("final", param=n)] = _host(p)
        for n, b in self._module.named_buffers():
            self._tensors[_schema.name("buffer", param=n)] = _host(b)
        meta = {
            "format": FORMAT,
            "run": "ddp" if self._world > 1 else "single",
            "world_size": str(self._world),
            "dtype": DTYPES[self._dtype],
            "torch_version": torch.__version__,
            "steps": str(self._steps),
            "magnitudes": {"element": "true", "tensor": "per tensor", None: "false"}[self._magnitudes],
            **self._meta,
        }
        if self._world > 1:
            meta.setdefault("ddp_forward", "none")
        if self._others:
            meta["unrecorded_optimizers"] = ", ".join(sorted(self._others.values()))
        if rank_world()[0] == 0:
            self._keep()
            self._open().close(meta)
            self._stream = None
        self._tensors = {}

    def finish(self, state: str) -> None:
        """Records nothing more (`state` says why); a trace not "closed" is not written."""
        self.state = state
        if state != "closed" and self._stream is not None:
            self._stream.abandon()
            self._stream = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._own_watch:
            self._watch.close()

