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

Sampled traces (`sample=N`, or "auto" for a model of more than `_schema.SAMPLE_FROM_PARAMETERS`
parameters): of each parameter of more than N elements the trace keeps N flat positions
(`positions.<p>`, with its `shape.<p>`), drawn from a fixed seed, the parameter's name and
shape, so every leg and rank keeps the same ones. There it records each step's gradient and
magnitudes and the final weights and peaks; per step it adds the whole gradient's sum, sum of
squares and max |g| in float64 (`summary.<s>.<p>`; `final_summary.<p>` of the final weight).
Smaller parameters and buffers stay whole. A sampled trace holds about N x tensors x steps
elements (twice that with magnitudes) plus 3 float64 per tensor per step, whatever the
model's size; a step reads each sampled gradient once (its summaries) and, under CUDA, sends
what it keeps of all of them to the host in one copy.
"""
from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from types import FrameType
from typing import Any, Callable, Union

import torch
import torch.distributed as dist

from . import _schema, _sharded, _watch
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


def add_backward(
    sums: dict[Any, Any],
    counts: dict[Any, int],
    key: Any,
    grad: torch.Tensor,
    how: str | None,
    take: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """One backward's gradient of one parameter: counted, and its magnitude added to `sums`
    per element (`how` "element") or as its largest |value| ("tensor"), in at least float32,
    so that many half-precision terms keep their sum. `take`: the elements kept of a sampled
    parameter (per element, at its positions: the rest of the tensor is never read)."""
    counts[key] = counts.get(key, 0) + 1
    if not how:
        return
    if how == "tensor" and take is None:
        # One read pass that allocates nothing the size of the tensor; the rest of the
        # arithmetic waits for the step, where it is done for every backward at once.
        sums.setdefault(key, []).append(torch.aminmax(grad.detach()))
        return
    g = grad.detach() if take is None else take(grad.detach())
    g = g.abs().to(torch.promote_types(grad.dtype, torch.float32))
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


def sample_positions(name: str, shape: tuple[int, ...] | torch.Size, n: int) -> torch.Tensor:
    """The `n` flat positions a sampled trace keeps of parameter `name` of `shape`: int64,
    increasing, on the CPU. They depend on the name and shape alone (a fixed seed hashed with
    them, never the data, the rank or the leg), so every run of the same model keeps the
    same ones, whatever the torch version: drawn with Python's random.Random.random(), whose
    sequence for a seed Python guarantees, not torch's generators (torch.randint's draws
    for one seed differ between torch 2.5 and 2.13). About n draws, whatever the size."""
    numel = 1
    for d in shape:
        numel *= int(d)
    if not 0 < n < numel:
        raise ValueError(f"ddp_verify_trace: {n} positions of {name} with {numel} elements")
    digest = hashlib.blake2b(f"ddp-verify/{name}/{tuple(int(d) for d in shape)}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little") & (2**63 - 1))
    # Where more than half are kept, the ones left out are drawn instead (as few draws).
    want = min(n, numel - n)
    drawn: dict[int, None] = {}  # distinct positions in the order drawn
    while len(drawn) < want:
        drawn[min(int(rng.random() * numel), numel - 1)] = None
    if want == n:
        return torch.tensor(sorted(drawn), dtype=torch.int64)
    keep = torch.ones(numel, dtype=torch.bool)
    keep[torch.tensor(list(drawn), dtype=torch.int64)] = False
    return keep.nonzero().reshape(-1)


def _offsets(positions: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """Where the elements at flat (row-major) `positions` of a tensor of `shape` and
    `strides` lie in its memory, counted from its first element."""
    rest = positions.clone()
    out = torch.zeros_like(positions)
    for size, stride in zip(reversed(shape), reversed(strides)):
        out += (rest % size) * stride
        rest //= size
    return out


class Summaries:
    """Each tensor's [sum, sum of squares, max |x|] over all its elements, in float64, as a
    float64 tensor of 3 on its device (no host sync): chunk by chunk through one reused
    float64 buffer per device, so nothing the size of the tensor is allocated. NaN anywhere
    gives NaN (sum, dot and amax all propagate it)."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, torch.Tensor] = {}

    @staticmethod
    def _chunk(device: torch.device) -> int:
        # CPU: 2 MB of float64, which stays in cache between the copy and the three reads
        # (bench: 1<<18 beat 1<<16 and 1<<20). GPU: larger, fewer launches.
        return 1 << 22 if device.type != "cpu" else 1 << 18

    def __call__(self, t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Into `out` (float64, 3 elements, on `t`'s device) where given."""
        flat = _memory_order(t.detach())
        n, device = flat.numel(), flat.device
        if out is not None and out.device != device:  # a model spread over devices
            return out.copy_(self(t))
        if out is None:
            out = torch.empty(3, dtype=torch.float64, device=device)
        if n == 0:
            return out.zero_()
        chunk = self._chunk(device)
        buf = self._buffers.get(device)
        if buf is None or buf.numel() < min(chunk, n):
            buf = self._buffers[device] = torch.empty(min(chunk, n), dtype=torch.float64, device=device)
        count = -(-n // chunk)
        # One chunk: straight into `out`; more: each chunk's into a row, then added up.
        parts = out.view(1, 3) if count == 1 else torch.empty(count, 3, dtype=torch.float64, device=device)
        for i in range(count):
            src = flat[i * chunk : (i + 1) * chunk]
            b = buf[: src.numel()]
            b.copy_(src)
            torch.sum(b, 0, out=parts[i, 0])
            torch.dot(b, b, out=parts[i, 1])
            torch.amax(b.abs_(), 0, out=parts[i, 2])
        if count > 1:
            torch.sum(parts[:, :2], 0, out=out[:2])
            torch.amax(parts[:, 2], 0, out=out[2])
        return out

    def clear(self) -> None:
        self._buffers = {}


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """All of `t`'s elements once each as a 1-D tensor: a view in memory order where `t` is
    dense (contiguous, or a permutation of contiguous such as channels_last), else a copy."""
    if t.is_contiguous():
        return t.reshape(-1)
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    permuted = t.permute(order)
    return permuted.reshape(-1) if permuted.is_contiguous() else t.reshape(-1)


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
# sample=: a positive int N (positions kept per tensor), "auto", or None/"full" (whole tensors).
Sample = Union[int, str, None]


def check_sample(value: Sample, what: str = "sample") -> int | str | None:
    """`value` as the recorder keeps it (N, "auto" or None for whole), or a ValueError now."""
    if value is None or (isinstance(value, str) and value == "full"):
        return None
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(
        f"ddp_verify_trace: {what} must be a positive int (positions kept per tensor), 'auto' or "
        f"'full' (whole tensors), not {value!r}"
    )


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
    at every optimizer step, and `close()` at the end; rank 0 alone writes `path`.
    `sample`: N, "auto" or None (whole tensors): see the module's docstring."""

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
        sample: Sample = None,
        engine: Any = None,
    ) -> None:
        self._module = unwrap(module)
        self.path = check_path(path, overwrite)
        self._magnitudes = check_magnitudes(magnitudes)
        sample = check_sample(sample)
        self._params = params or [(n, p) for n, p in self._module.named_parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("ddp_verify_trace: the model has no parameters that require grad; nothing to record")
        # DeepSpeed ZeRO (a `_deepspeed.Engine`): the optimizer steps fp32 partitions, not
        # the model's parameters (bit16 copies, or under stage 3 empty between forwards).
        # The caller gives each step's whole gradients (`step(grads=)`) and weights
        # (`keep_whole`), gathered in the inner optimizer's hooks; nothing here is a collective
        # after this constructor, so the trace is written at exit after the engine is gone.
        self._engine = engine
        self._shapes = {n: tuple(engine.shape(p)) if engine is not None else tuple(p.shape) for n, p in self._params}
        dtypes = sorted({str(p.dtype) for _, p in self._params})
        if engine is not None:
            dtypes = ["torch.float32"]  # the master weights and the gradients they step with
        if len(dtypes) > 1:
            raise ValueError(
                f"ddp_verify_trace: the parameters mix dtypes ({', '.join(dtypes)}); a trace holds one float "
                "dtype, so cast the model to one (model.to(dtype)) before recording"
            )
        self._dtype = self._params[0][1].dtype if engine is None else torch.float32
        # FSDP2: parameters are DTensors, each rank holding a shard; every rank gathers.
        self._sharded = any(_sharded.is_sharded(p) for _, p in self._params)
        if self._dtype not in DTYPES:
            raise ValueError(f"ddp_verify_trace: parameters are {self._dtype}; ddp-verify reads {', '.join(DTYPES.values())}")
        self._meta = dict(meta or {})
        numels = {n: _numel(shape) for n, shape in self._shapes.items()}
        total = sum(numels.values())
        self._meta["parameters"] = str(total)
        if sample == "auto":
            sample = _schema.SAMPLE_SIZE if total > _schema.SAMPLE_FROM_PARAMETERS else None
        if sample is not None and all(numels[n] <= sample for n, _ in self._params):
            sample = None  # nothing to sample: a whole trace, as any reader takes it
        # N, or None: whole tensors. Each sampled parameter's positions, on its device.
        self._sample: int | None = sample  # type: ignore[assignment]
        self._positions: dict[str, torch.Tensor] = {}
        self._cpu_positions: dict[str, torch.Tensor] = {}
        self._offsets: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
        self._summaries = Summaries()
        if self._sample is not None:
            self._meta["sample"] = str(self._sample)
            for n, p in self._params:
                if numels[n] > self._sample:
                    self._cpu_positions[n] = sample_positions(n, self._shapes[n], self._sample)
                    self._positions[n] = self._cpu_positions[n].to(p.device if engine is None else "cpu")
            # Magnitudes per element at the positions (one gather per backward), whatever was
            # asked: a per-tensor maximum of a sampled tensor would cost a read of all of it.
            if self._magnitudes:
                self._magnitudes = "element"
        self._shards: dict[str, _sharded.Shard] = {}
        # What this recorder could not record (the header's `warnings`, one per line).
        self._warnings: list[str] = []
        if self._sharded:
            # FSDP2 adds each backward's gradient into its own unsharded buffers, which no
            # tensor hook on the (sharded) parameters sees: no magnitudes per micro-batch.
            if self._magnitudes:
                self._warnings.append("FSDP2: no per-micro-batch magnitudes (each backward adds into FSDP2's own buffers)")
            self._magnitudes = None
            self._shards = {
                n: _sharded.Shard(p, self._cpu_positions.get(n)) for n, p in self._params if _sharded.is_sharded(p)
            }
        # The whole weights on the host (DeepSpeed: gathered by the engine; None otherwise).
        self._whole: dict[str, torch.Tensor] | None = None
        self._counter: Any = None
        if engine is not None:
            # No tensor hook sees a micro-batch's gradient of a flat partition: no magnitudes;
            # the backwards are counted by a hook on one parameter.
            if self._magnitudes:
                self._warnings.append("DeepSpeed: no per-micro-batch magnitudes (its partitions are flat)")
            self._magnitudes = None
            self._whole = {n: engine.full_param(p) for n, p in self._params}  # collective
            self._meta["engine"] = engine.name
            self._meta["engine_accumulation"] = str(engine.gas)
            bit16 = {p.dtype for _, p in self._params} - {torch.float32}
            if len(bit16) == 1 and next(iter(bit16)) in DTYPES:
                self._meta["compute_dtype"] = DTYPES[next(iter(bit16))]
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
        # A sampled parameter's at its positions only; a sharded one's on its own shard (each
        # rank its own), gathered at close.
        self._peaks = {
            n: _sharded.local(p.detach()).abs() if n in self._shards else self._kept(n, self._weight(n, p)).abs()
            for n, p in self._params
        }
        self._last_step: float | None = None  # perf_counter at the previous step
        self._closed_at_destroy = False
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
        if engine is not None:
            self._hooks = []
            self._counter = engine.count_backwards()
        else:
            self._hooks = [] if self._sharded else [p.register_hook(self._summer(n, p)) for n, p in self._params]
        if self._sharded:
            self._watch.on_destroy = self._on_destroy

    def _weight(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """The parameter's weight as the optimizer keeps it: the whole weight kept on the
        host under DeepSpeed, else the parameter itself."""
        return self._whole[name] if self._whole is not None else p.detach()

    def keep_whole(self, weights: dict[str, torch.Tensor]) -> None:
        """The whole weights a DeepSpeed step made (on the host; every rank's), for the
        peaks and the final weights: close() then needs no collective."""
        self._whole = {n: weights.get(n, w) for n, w in (self._whole or {}).items()}

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
            take = (lambda g: self._take(name, g)) if name in self._positions else None
            add_backward(self._sums, self._counts, name, grad, self._magnitudes, take)

        return hook

    def _take(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t`'s elements at `name`'s positions (1-D, in their order), read in place: one
        gather, never a copy of `t`, whatever its strides (channels_last, a bucket's view,
        an expanded gradient)."""
        pos = self._positions[name]
        if pos.device != t.device:
            pos = self._positions[name] = pos.to(t.device)
        if t.is_contiguous():
            return t.reshape(-1).index_select(0, pos)
        strides = tuple(t.stride())
        cached = self._offsets.get(name)
        if cached is None or cached[0] != strides or cached[1].device != t.device:
            cached = self._offsets[name] = (strides, _offsets(pos, tuple(t.shape), strides))
        span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, strides))
        return t.as_strided((span,), (1,)).index_select(0, cached[1])

    def _kept_shape(self, name: str, p: torch.Tensor) -> tuple[int, ...]:
        return (self._positions[name].numel(),) if name in self._positions else tuple(p.shape)

    def _kept(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """What a trace keeps of `t`, a tensor of parameter `name`: its positions' elements
        where it is sampled, else all of it."""
        return self._take(name, t) if name in self._positions else t

    def saw_other_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Another optimizer stepped: its parameters are not in this trace, and the report says so."""
        self._others[id(optimizer)] = type(optimizer).__name__

    def take_sums(self, sums: dict[str, Any], counts: dict[str, int]) -> None:
        """Magnitudes gathered before this recorder existed (the zero-edit hook's), as
        `magnitudes=` said, before the positions were known. Sampled, they become per
        element: sums per element are gathered at the positions; per-tensor maxima are
        summed and spread over every element kept (an upper bound of each, so sound)."""
        if self._engine is not None:  # DeepSpeed: the first step's backwards only
            self._counts.update(counts)
            return
        if self._sample is not None and self._magnitudes:
            params = dict(self._params)
            for n, v in sums.items():
                p = params.get(n)
                if p is None:
                    continue
                if isinstance(v, list):
                    top = _largest_sums([v], self._acc_dtype, p.device)
                    shape = self._kept_shape(n, p)
                    v = top.expand(shape).clone() if v else torch.zeros(shape, dtype=self._acc_dtype, device=p.device)
                elif n in self._positions:
                    v = self._take(n, v)
                self._sums[n] = v
        else:
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
        # page faults than the arithmetic. Rank 0's alone are written (DDP's weights agree);
        # under FSDP2 every rank keeps its shard's.
        if rank_world()[0] != 0 and not self._sharded:
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
            if n in self._shards:
                torch.maximum(self._peaks[n], _sharded.local(p.detach()).abs(), out=self._peaks[n])
                continue
            if n in self._positions:
                torch.maximum(self._peaks[n], self._take(n, self._weight(n, p)).abs_(), out=self._peaks[n])
                continue
            scratch = self._scratch.get(n)
            if scratch is None:
                scratch = self._scratch[n] = torch.empty_like(self._peaks[n])
            torch.abs(self._weight(n, p), out=scratch)
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
        sums = {
            n: torch.zeros(self._kept_shape(n, p), dtype=self._acc_dtype, device=p.device) if sums[n] is None else sums[n]
            for n, p in self._params
        }
        if world > 1:
            flat = torch.cat([s.reshape(-1) for s in sums.values()])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(world)
            parts = flat.split([s.numel() for s in sums.values()])
            sums = {n: part.view(s.shape) for (n, s), part in zip(sums.items(), parts)}
        return sums

    def _gradients(self) -> tuple[dict[str, torch.Tensor | None], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """Each parameter's gradient as the trace keeps it: `.grad`, or under FSDP2 the whole
        gradient gathered from the shards (whole traces), and for sampled sharded parameters
        (second dict) their kept values and summaries on the host, gathered without the whole
        tensor. Collectives under FSDP2: every rank calls this at every step."""
        grads = {n: p.grad for n, p in self._params}
        if not self._sharded:
            return grads, {}
        out: dict[str, torch.Tensor | None] = {}
        gathered: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        pick = [n for n, _ in self._params if n in self._positions and n in self._shards and grads[n] is not None]
        gather = [n for n, _ in self._params if grads[n] is not None and n not in pick]
        wholes = dict(zip(gather, _sharded.whole_many([grads[n].detach() for n in gather])))  # type: ignore[union-attr]
        for n, _ in self._params:
            out[n] = wholes.get(n)
        if pick:
            shards = [self._shards[n] for n in pick]
            n_kept = [self._positions[n].numel() for n in pick]
            kept = _sharded.gather_kept([sh.take(grads[n], k) for n, sh, k in zip(pick, shards, n_kept)], shards)  # type: ignore[arg-type]
            rows = _sharded.whole_summaries([grads[n] for n in pick], shards, self._summaries)  # type: ignore[misc]
            rows = rows.cpu()
            for i, n in enumerate(pick):
                gathered[n] = (kept[i].cpu(), rows[i].clone())
                out[n] = grads[n]
        return out, gathered

    def _engine_facts(self, s: int, world: int) -> None:
        """What synchronised the step's gradients and at what cost: the engine, FSDP2's
        divide factor and compute dtype, the step's gradient collectives and bytes (one
        rank's) and the seconds since the previous step."""
        now = time.perf_counter()
        if self._last_step is not None:
            self._tensors[_schema.name("seconds", s)] = torch.tensor([now - self._last_step], dtype=torch.float64)
        self._last_step = now
        collectives, nbytes = self._watch.take_comm()
        w = self._watch
        if w.engine is not None and world > 1:
            self._meta["engine"] = w.engine
            self._tensors[_schema.name("comm", s)] = torch.tensor([collectives, nbytes], dtype=torch.int64)
        if w.engine == "fsdp2" and world > 1:
            self._meta["grad_divide"] = repr(float(w.divide if w.divide is not None else world))
        if w.compute_dtype is not None and w.compute_dtype != self._dtype and w.compute_dtype in DTYPES:
            self._meta["compute_dtype"] = DTYPES[w.compute_dtype]

    def _on_destroy(self) -> None:
        """The process group is about to go: a sharded model's trace is written now, while
        its weights can still be gathered (a later close() has nothing left to do)."""
        if self.state == "open" and self._steps:
            self.close()
            self._closed_at_destroy = True

    def _sharded_finals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Each sharded parameter's final weight and peaks as the trace keeps them, on the
        host, gathered from every rank's shard (collectives: every rank calls this once, at
        close); with the whole weight's summaries where sampled, else None."""
        if not self._shards:
            return {}
        out: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        params = dict(self._params)
        pick = [n for n in self._shards if n in self._positions]
        for n, sh in self._shards.items():
            if n not in pick:
                out[n] = (_host(_sharded.whole(params[n].detach())), _host(sh.gather(self._peaks[n])), None)
        if pick:
            shards = [self._shards[n] for n in pick]
            sizes = [self._positions[n].numel() for n in pick]
            finals = _sharded.gather_kept([sh.take(params[n], k) for n, sh, k in zip(pick, shards, sizes)], shards)
            peaks = _sharded.gather_kept([sh.take(self._peaks[n], k) for n, sh, k in zip(pick, shards, sizes)], shards)
            rows = _sharded.whole_summaries([params[n].detach() for n in pick], shards, self._summaries).cpu()
            for i, n in enumerate(pick):
                out[n] = (finals[i].cpu().to(self._dtype), peaks[i].cpu().to(self._dtype), rows[i].clone())
        return out

    def _rank_bits(self, world: int, grads: dict[str, torch.Tensor | None]) -> torch.Tensor:
        """Every rank's checksum of every gradient, gathered on every rank (one all_gather).
        Under FSDP2 of the gathered whole gradient: every rank must have gathered the same."""
        mine = torch.stack(
            [
                _bits(g) if (g := grads[n]) is not None and not _sharded.is_sharded(g) else torch.zeros((), dtype=torch.int64, device=p.device)
                for n, p in self._params
            ]
        )
        out = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(out, mine)
        return torch.stack([o.cpu() for o in out])  # [W, P]

    def step(
        self,
        optimizer: torch.optim.Optimizer | None = None,
        skipped: bool = False,
        *,
        grads: dict[str, torch.Tensor | None] | None = None,
        lrs: list[float] | None = None,
    ) -> None:
        """Records the gradients as they are now: the ones this optimizer step applies (or,
        `skipped`, the ones a GradScaler found inf/NaN in and did not apply). `grads`: each
        parameter's whole gradient as the step applied it, given by the caller instead of read
        from `.grad` (DeepSpeed's, gathered from the partitions; None or missing: not
        stepped); `lrs`: the learning rates per parameter group, where the optimizer's
        `param_groups` do not say them all at the call (ZeRO narrows them)."""
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
        syncs = self._watch.take_syncs()
        # Under FSDP2 the backwards are its parameter groups' (no tensor hook sees them).
        micro = len(syncs) if self._sharded else max(self._counts.values(), default=0)
        if self._counter is not None:  # DeepSpeed: the hook's count, the early hooks' at step 0
            micro += self._counter.take()
        self._counts = {}
        self._tensors[_schema.name("micro", s)] = torch.tensor([micro], dtype=torch.int64)
        self._engine_facts(s, world)
        if optimizer is not None:
            if lrs is None:
                lrs = [float(g["lr"]) for g in optimizer.param_groups]
            self._tensors[_schema.name("lr", s)] = torch.tensor(lrs, dtype=torch.float64)
            self._settings(optimizer)
        calls, last = self._watch.take_clips()
        self._tensors[_schema.name("clips", s)] = torch.tensor([calls], dtype=torch.int64)
        if calls:
            self._tensors[_schema.name("clip", s)] = torch.tensor(last, dtype=torch.float64)
        if syncs:
            self._tensors[_schema.name("ddp_sync", s)] = torch.tensor(syncs, dtype=torch.int64)
            if not self._sharded:
                self._meta["ddp_forward"] = "seen"
        # Each parameter's gradient as the whole tensor: gathered from the shards under FSDP2
        # (every rank takes part), or kept positions and summaries gathered where sampled.
        if grads is not None:
            grads, gathered = {n: grads.get(n) for n, _ in self._params}, {}
        else:
            grads, gathered = self._gradients()
        # DeepSpeed's ranks hold partitions, and its gradients come gathered: no checksums.
        ranks_agree = self._engine is None and (not self._sharded or not self._positions)
        bits = self._rank_bits(world, grads) if world > 1 and ranks_agree else None
        # Only rank 0 writes: the others take part in the collectives above and keep nothing,
        # so they do not slow every DDP step with copies of their gradients.
        if rank_world()[0] != 0:
            self._tensors = {}
            self._steps += 1
            return
        big: list[tuple[str, torch.Tensor]] = []
        lent: list[tuple[str, torch.Tensor]] = []
        # Per sampled parameter: (name, values at its positions, magnitudes there or None),
        # and the whole gradients' summaries, all on the device until one copy to the host.
        sampled: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
        summaries = self._summary_rows(sum(grads[n] is not None for n, _ in self._params if n in self._positions and n not in gathered))
        if self._magnitudes == "tensor":  # one small tensor for all parameters, split at close
            sums = dict(zip((n for n, _ in self._params), sums.to("cpu", self._dtype).unbind()))
        for i, (n, p) in enumerate(self._params):
            g = grads[n]
            if g is None:  # no gradient: the optimizer leaves this parameter alone
                continue
            if bits is not None:
                self._tensors[_schema.name("rank_bits", s, n)] = bits[:, i].contiguous()
            if n in gathered:
                kept, summary = gathered[n]
                big.append((_schema.name("grads", s, n), kept.to(self._dtype)))
                self._tensors[_schema.name("summary", s, n)] = summary
                continue
            if n in self._positions:
                g = g.detach()
                self._summaries(g, summaries[len(sampled)])
                sampled.append((n, self._take(n, g), sums[n] if self._magnitudes else None))
                continue
            grad = (_schema.name("grads", s, n), g)
            (lent if self._nulled.get(n) and g is p.grad and _owns_memory(g) else big).append(grad)
            if self._magnitudes == "element":
                big.append((_schema.name("scale", s, n), sums[n].to(g.dtype)))
            elif self._magnitudes:
                self._tensors[_schema.name("scale", s, n)] = sums[n]
        for n, kept, scale, summary in self._to_host(sampled, summaries):
            big.append((_schema.name("grads", s, n), kept))
            if scale is not None:
                big.append((_schema.name("scale", s, n), scale))
            self._tensors[_schema.name("summary", s, n)] = summary
        self._open().put(big, lent)
        self._keep()
        self._steps += 1
        self._seen = set()

    def _summary_rows(self, count: int) -> torch.Tensor:
        """[count, 3] float64 on the parameters' device, a row per sampled tensor's summaries."""
        device = self._params[0][1].device if self._engine is None else torch.device("cpu")
        return torch.empty(count, 3, dtype=torch.float64, device=device)

    def _to_host(
        self, sampled: list[tuple[str, torch.Tensor, torch.Tensor | None]], summaries: torch.Tensor
    ) -> list[tuple[str, torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """The sampled parameters' small tensors on the host, in one copy from the device:
        packed as float64 (which holds every float32, bfloat16 and float16 value exactly),
        moved, split, and the samples and magnitudes cast back to the trace's dtype (a value
        cast there rounds as it would have from where it was summed)."""
        if not sampled:
            return []
        device = summaries.device
        parts = [summaries.reshape(-1)]
        for _, kept, scale in sampled:
            parts += [kept.reshape(-1).to(device)] + ([] if scale is None else [scale.reshape(-1).to(device)])
        # cat promotes every part to float64 in the one kernel.
        wide = torch.cat(parts).cpu()
        rows = wide[: summaries.numel()].view(-1, 3).clone()  # kept apart from the step's buffer
        narrow = wide[summaries.numel() :].to(self._dtype)
        out = []
        at = 0
        for i, (n, kept, scale) in enumerate(sampled):
            values = narrow[at : at + kept.numel()]
            at += kept.numel()
            moved = None
            if scale is not None:
                moved = narrow[at : at + scale.numel()]
                at += scale.numel()
            out.append((n, values, moved, rows[i]))
        return out

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
        if self.state == "closed" and self._closed_at_destroy:
            return  # written when the process group went (FSDP2)
        self.check_open("close()")
        self.finish("closed")
        self.settle()
        self.track_peaks()
        sampled: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
        finals = self._sharded_finals()
        summaries = self._summary_rows(len([n for n in self._positions if n not in finals]))
        for n, p in self._params:
            if n in finals:
                final, peak, summary = finals[n]
                self._tensors[_schema.name("final", param=n)] = final
                self._tensors[_schema.name("peak", param=n)] = peak
                if summary is not None:
                    self._tensors[_schema.name("final_summary", param=n)] = summary
                    self._tensors[_schema.name("positions", param=n)] = self._cpu_positions[n]
                    self._tensors[_schema.name("shape", param=n)] = torch.tensor(list(p.shape), dtype=torch.int64)
                continue
            if n in self._positions:
                w = self._weight(n, p)
                self._summaries(w, summaries[len(sampled)])
                sampled.append((n, self._take(n, w), self._peaks[n]))
                continue
            self._tensors[_schema.name("peak", param=n)] = _host(self._peaks[n])
            self._tensors[_schema.name("final", param=n)] = _host(self._weight(n, p))
        for n, final, peak, summary in self._to_host(sampled, summaries):
            self._tensors[_schema.name("final", param=n)] = final
            self._tensors[_schema.name("peak", param=n)] = peak  # type: ignore[assignment]
            self._tensors[_schema.name("final_summary", param=n)] = summary
            self._tensors[_schema.name("positions", param=n)] = self._cpu_positions[n]
            self._tensors[_schema.name("shape", param=n)] = torch.tensor(list(self._shapes[n]), dtype=torch.int64)
        self._summaries.clear()
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
        if self._world > 1 and self._engine is None:  # DeepSpeed's engine is no DDP
            meta.setdefault("ddp_forward", "none")
        if self._warnings:
            meta["warnings"] = "\n".join(self._warnings)
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
        if self._counter is not None:
            self._counter.close()
            self._counter = None
        if self._own_watch:
            self._watch.close()

