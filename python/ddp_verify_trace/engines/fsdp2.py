"""FSDP2 (`fully_shard`): parameters are DTensors, each rank holding a shard; what a trace
needs of them is read as the whole tensor would be, with as little traffic as that allows.

Whole traces gather each whole gradient (one all-gather for all of a step's) and weight.
Sampled traces never do: each rank takes the kept positions that fall in its own shard and
one all-reduce puts them together (each position has one owner), and each whole tensor's
float64 [sum, sum of squares, max |x|] is its shards' sums added up and their maxima's
maximum. Every gather is a collective: every rank makes the same ones, in the same order
(the recorder's step and close run on every rank), so the trace is written when the process
group is destroyed, while it can still gather.

Ranks hold different shards by design, so no per-rank checksum of a shard is recorded; what
must agree (the gathered gradient, every rank stepping) is checked from the gathered tensor.

FSDP2's parameter groups end each backward in `post_backward`, where it reduce-scatters
unless told not to (`set_requires_gradient_sync`): patched once the script imports FSDP2
(never imported by the recorder: importing torch's sharding machinery into a DDP run made
gloo hang at exit now and then), it notes each micro-batch's flag, the bytes, the divide
factor and the MixedPrecisionPolicy's compute dtype. No tensor hook sees a micro-batch's
gradient (each backward adds into FSDP2's own buffers): no magnitudes.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _collectives, _schema
from .._patches import Patches
from .._positions import Sampling, Summaries
from .._tensors import host
from .base import Engine, Finals, Gathered, Named

# FSDP2's module whose parameter groups end each backward.
_GROUP_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"


class Fsdp2(Engine):
    """Parameters sharded over the ranks as DTensors (FSDP2's)."""

    name = _schema.Engine.FSDP2
    backward_hooks = False
    local_hooks = False  # its unsharded gradients, at post_backward (`_local_grads`)
    no_magnitudes = "FSDP2: no per-micro-batch magnitudes (each backward adds into FSDP2's own buffers)"
    peaks_on_every_rank = True
    write_at_destroy = True
    weights_replicated = False  # each rank holds its own shards

    def __init__(self) -> None:
        self._shards: dict[str, Shard] = {}

    @classmethod
    def find(cls, optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor]) -> Engine | None:
        return cls() if any(is_sharded(p) for p in params) else None

    @staticmethod
    def patch(patches: Patches) -> None:
        def patch_group(module: Any) -> None:
            group_class = module.FSDPParamGroup
            post_backward = group_class.post_backward

            def _post_backward(self: Any, *args: Any, **kwargs: Any) -> Any:
                for watch in patches.watches():
                    try:
                        _backward_ended(watch, self, bool(self.reduce_grads))
                    except Exception:  # noqa: BLE001 - an internal renamed: nothing seen, training goes on
                        pass
                return post_backward(self, *args, **kwargs)

            patches.replace(group_class, "post_backward", _post_backward)

        patches.after_import(_GROUP_MODULE, patch_group)

    def start(self, params: Named, sampling: Sampling) -> dict[str, str]:
        self._shards = {n: Shard(p, sampling.cpu.get(n)) for n, p in params if is_sharded(p)}
        return {}

    def local_weight(self, name: str, p: torch.Tensor) -> torch.Tensor | None:
        return local(p.detach()) if name in self._shards else None

    def backwards(self, counts: dict[str, int], reduced: list[bool]) -> int:
        # The backwards are its parameter groups' (no tensor hook sees them).
        return len(reduced)

    def rank_checksums(self, sampled: bool) -> bool:
        # Of the gathered whole gradient: every rank must have gathered the same.
        return not sampled

    def gradients(self, params: Named, sampling: Sampling, summaries: Summaries) -> tuple[dict[str, Any], Gathered]:
        """The whole gradients gathered from the shards (whole traces), and for sampled
        sharded parameters their kept values and summaries on the host, gathered without the
        whole tensor."""
        grads = {n: p.grad for n, p in params}
        out: dict[str, Any] = {}
        gathered: Gathered = {}
        pick = [n for n, _ in params if n in sampling and n in self._shards and grads[n] is not None]
        gather = [n for n, _ in params if grads[n] is not None and n not in pick]
        wholes = dict(zip(gather, whole_many([grads[n].detach() for n in gather])))  # type: ignore[union-attr]
        for n, _ in params:
            out[n] = wholes.get(n)
        if pick:
            shards = [self._shards[n] for n in pick]
            kept = gather_kept([sh.take(grads[n], sampling.count(n)) for n, sh in zip(pick, shards)], shards)
            rows = whole_summaries([grads[n] for n in pick], shards, summaries).cpu()
            for i, n in enumerate(pick):
                gathered[n] = (kept[i].cpu(), rows[i].clone())
                out[n] = grads[n]
        return out, gathered

    def step_facts(self, watch: Any, world: int, reduced: list[bool]) -> dict[str, str]:
        if watch.engine != self.name or world <= 1:
            return {}
        divide = watch.divide if watch.divide is not None else world  # its default: averaged
        facts = {_schema.Key.GRAD_DIVIDE: repr(float(divide))}
        # A reduce-scatter narrower than the gradients it averages (bfloat16 where they are
        # float32): its rounding is the run's own, named and allowed for.
        reduce, grads = watch.reduce_dtype, watch.reduce_from
        if reduce in _NARROW and grads is not None and grads not in _NARROW:
            facts[_schema.Key.REDUCE_DTYPE] = _schema.Dtype.BFLOAT16 if reduce == torch.bfloat16 else _schema.Dtype.FLOAT16
        return facts

    def finals(self, params: Named, peaks: dict[str, torch.Tensor], sampling: Sampling, summaries: Summaries) -> Finals:
        """Each sharded parameter's final weight and peaks, gathered from every rank's shard;
        with the whole weight's summaries where sampled."""
        if not self._shards:
            return {}
        out: Finals = {}
        named = dict(params)  # the parameters whose finals are written (not a frozen base)
        pick = [n for n in self._shards if n in sampling and n in named]
        for n, sh in self._shards.items():
            if n not in pick and n in named:
                out[n] = (host(whole(named[n].detach())), host(sh.gather(peaks[n])), None)
        if pick:
            shards = [self._shards[n] for n in pick]
            dtype = named[pick[0]].dtype
            finals = gather_kept([sh.take(named[n], sampling.count(n)) for n, sh in zip(pick, shards)], shards)
            tops = gather_kept([sh.take(peaks[n], sampling.count(n)) for n, sh in zip(pick, shards)], shards)
            rows = whole_summaries([named[n].detach() for n in pick], shards, summaries).cpu()
            for i, n in enumerate(pick):
                out[n] = (finals[i].cpu().to(dtype), tops[i].cpu().to(dtype), rows[i].clone())
        return out

    def closing_facts(self, world: int) -> dict[str, str]:
        return {_schema.Key.DDP_FORWARD: _schema.DdpForward.NONE} if world > 1 else {}


def _backward_ended(watch: Any, group: Any, reduced: bool) -> None:
    """One FSDP2 parameter group's backward ended, reduce-scattering or not: the engine is
    known from its first backward, even where it never reduces."""
    watch.engine = Fsdp2.name
    watch.reduced(reduced, group=id(group))
    factor = getattr(group, "gradient_divide_factor", None)
    if factor is not None:  # one group's own factor is the fact, whatever the others'
        watch.divide = float(factor)
    params = getattr(group, "fsdp_params", [])
    # The MixedPrecisionPolicy's compute dtype: the group's policy up to torch 2.14, each
    # parameter's resolved one (FSDPParam.param_dtype, there since FSDP2 began) from 2.15,
    # whose group has no mp_policy.
    policy = getattr(group, "mp_policy", None)
    dtypes = [getattr(policy, "param_dtype", None)] + [getattr(fp, "param_dtype", None) for fp in params]
    dtype = next((d for d in dtypes if isinstance(d, torch.dtype)), None)
    if dtype is not None:
        watch.compute_dtype = dtype
    if reduced:
        _local_grads(watch, params)
        orig = next((fp.orig_dtype for fp in params if isinstance(getattr(fp, "orig_dtype", None), torch.dtype)), None)
        reduce = _reduce_dtype(group, params) or orig or torch.float32
        watch.reduce_dtype, watch.reduce_from = reduce, orig
        size = torch.empty((), dtype=reduce).element_size()
        watch.synced(Fsdp2.name, 1, size * sum(int(fp.sharded_param.numel()) for fp in params))


_NARROW = (torch.bfloat16, torch.float16)


def _reduce_dtype(group: Any, params: list[Any]) -> torch.dtype | None:
    """The dtype this group's reduce-scatter runs in: the policy's reduce_dtype where set;
    else, from torch 2.15, what the group promotes its gradients' accumulation dtypes to
    (float32 for a float32 model), and up to 2.14 the gradients' own dtype (the
    MixedPrecisionPolicy's param_dtype). None where unknown."""
    chosen = getattr(group, "_reduce_dtype", None)
    if isinstance(chosen, torch.dtype):
        return chosen
    grads = [_accumulated(fp) for fp in params if hasattr(fp, "_unsharded_param")]
    pairs = [(fp, g) for fp, g in zip(params, grads) if isinstance(g, torch.Tensor)]
    promote = getattr(group, "_get_reduce_dtype", None)
    if promote is not None and pairs:
        dtype = promote([fp for fp, _ in pairs], [g for _, g in pairs])
        return dtype if isinstance(dtype, torch.dtype) else None
    return pairs[0][1].dtype if pairs else None


def _accumulated(fp: Any) -> torch.Tensor | None:
    """The unsharded gradient about to be reduced: the buffer a mixed-precision run
    accumulates in beside the grad (up to 2.14), else the grad itself."""
    accumulated = getattr(fp, "unsharded_accumulated_grad", None)
    return accumulated if isinstance(accumulated, torch.Tensor) else fp.unsharded_param.grad


def _local_grads(watch: Any, params: list[Any]) -> None:
    """This rank's whole gradient of each parameter about to be reduce-scattered: the
    micro-batches FSDP2 accumulated unsharded, and this backward's (the stage facts' local
    gradient before the reduction)."""
    for fp in params:
        if not hasattr(fp, "_unsharded_param"):
            continue
        grad = fp.unsharded_param.grad
        # Up to torch 2.14 a mixed-precision run accumulates in a buffer of its own beside the
        # grad; from 2.15 `unsharded_accumulated_grad` is that very grad: counted once.
        accumulated = getattr(fp, "unsharded_accumulated_grad", None)
        for g in (accumulated if accumulated is not grad else None, grad):
            if isinstance(g, torch.Tensor):
                watch.local_grad(fp.sharded_param, g)


def _dtensor_type() -> Any:
    # A DTensor exists only once its module was imported: the recorder never imports it
    # itself (importing torch's sharding machinery into a DDP run is not leaving it alone).
    if "torch.distributed.tensor" not in sys.modules and "torch.distributed._tensor" not in sys.modules:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 2.4 keeps it here
        try:
            from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
        except ImportError:
            return None
    return DTensor


def is_sharded(t: Any) -> bool:
    """A DTensor (FSDP2's parameters and their gradients)."""
    kind = _dtensor_type()
    return kind is not None and isinstance(t, kind)


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathered from the shards where `t` is a DTensor (a collective)."""
    return t.full_tensor() if is_sharded(t) else t


def whole_many(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor whole, as `whole` gives it, in one all-gather where all are DTensors of
    one dtype sharded on dim 0 over one 1-D mesh (FSDP2's layout: torch.chunk's rows, the
    last ranks' shorter or empty): every rank's shards packed into one padded buffer, so a
    step costs one collective, not one per parameter. Anything else: one each."""
    if not ts:
        return []
    first = ts[0]
    simple = all(
        is_sharded(t)
        and t.device_mesh is first.device_mesh
        and t.device_mesh.ndim == 1
        and len(t.placements) == 1
        and t.placements[0].is_shard(0)
        and t.dtype == first.dtype
        and t.dim() > 0
        for t in ts
    )
    if not simple or not dist.is_initialized():
        return [whole(t) for t in ts]
    mesh = first.device_mesh
    world, me = mesh.size(), mesh.get_local_rank()
    layout = []  # per tensor: (rows per chunk, elements per row, slot offset)
    total = 0
    for t in ts:
        n0 = int(t.shape[0])
        row = t.numel() // n0 if n0 else 0
        chunk = -(-n0 // world)
        layout.append((chunk, row, total))
        total += chunk * row
    device = local(first).device
    mine = torch.zeros(total, dtype=first.dtype, device=device)
    for t, (chunk, row, at) in zip(ts, layout):
        part = local(t).detach().reshape(-1)
        mine[at : at + part.numel()].copy_(part)
    parts = [torch.empty_like(mine) for _ in range(world)]
    _collectives.all_gather(parts, mine, group=mesh.get_group())
    out = []
    for t, (chunk, row, at) in zip(ts, layout):
        n0 = int(t.shape[0])
        pieces = [parts[r][at : at + max(0, min(chunk, n0 - r * chunk)) * row] for r in range(world)]
        out.append(torch.cat(pieces).reshape(t.shape).to(device))
    return out


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t` (all of it where `t` is no DTensor)."""
    return t.to_local() if is_sharded(t) else t


class Shard:
    """Where one parameter's local shard lies in the whole tensor, and which of its kept
    positions this rank owns."""

    def __init__(self, p: torch.Tensor, positions: torch.Tensor | None) -> None:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        self.shape, self.offset = tuple(int(d) for d in shape), tuple(int(o) for o in offset)
        self.mesh, self.placements, self.global_shape = p.device_mesh, p.placements, tuple(p.shape)
        self.stride = tuple(p.stride())
        # Replicated mesh dimensions (HSDP) hold a position on several ranks at once.
        self.replicas = 1
        for i, pl in enumerate(p.placements):
            if not pl.is_shard():
                self.replicas *= p.device_mesh.size(i)
        self.owned: torch.Tensor | None = None  # indices into the positions this rank owns
        self.at: torch.Tensor | None = None  # their flat offsets in the local shard
        if positions is not None:
            rest = positions.clone()
            inside = torch.ones_like(positions, dtype=torch.bool)
            local_flat = torch.zeros_like(positions)
            step = 1
            for size, lo, n in reversed(list(zip(self.global_shape, self.offset, self.shape))):
                i = rest % size
                rest //= size
                inside &= (i >= lo) & (i < lo + n)
                local_flat += (i - lo).clamp(min=0) * step
                step *= n
            self.owned = inside.nonzero().reshape(-1)
            self.at = local_flat[self.owned]

    def take(self, t: torch.Tensor, n: int) -> torch.Tensor:
        """The kept positions' values of sharded `t` that this rank owns, float64, zero
        elsewhere (`n` positions): summed over ranks, they are the whole tensor's."""
        out = torch.zeros(n, dtype=torch.float64, device=local(t).device)
        if self.owned is not None and self.owned.numel():
            flat = local(t).detach().reshape(-1)
            owned, at = self.owned.to(out.device), self.at.to(out.device)  # type: ignore[union-attr]
            out[owned] = flat.index_select(0, at).to(torch.float64)
        return out

    def gather(self, local_t: torch.Tensor) -> torch.Tensor:
        """The whole tensor whose shard on this rank is `local_t` (peaks kept per shard)."""
        from torch.distributed.tensor import DTensor

        d = DTensor.from_local(local_t, self.mesh, self.placements, shape=self.global_shape, stride=self.stride)
        return d.full_tensor()


def gather_kept(parts: list[torch.Tensor], shards: list[Shard]) -> list[torch.Tensor]:
    """Each sharded tensor's kept values (float64), from every rank's owned ones: one
    all-reduce for all of them."""
    if not parts:
        return []
    flat = torch.cat(parts)
    if dist.is_initialized():
        _collectives.all_reduce(flat, op=dist.ReduceOp.SUM)
    out = list(flat.split([p.numel() for p in parts]))
    return [o / s.replicas if s.replicas > 1 else o for o, s in zip(out, shards)]


def whole_summaries(
    tensors: list[torch.Tensor], shards: list[Shard], summarise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """[n, 3] float64: each whole tensor's [sum, sum of squares, max |x|] from its shards'
    (`summarise(local, out_row)`): sums added over ranks (and divided by the replicas),
    maxima's maximum; one all-reduce of each kind for all of them."""
    device = local(tensors[0]).device if tensors else torch.device("cpu")
    rows = torch.empty(len(tensors), 3, dtype=torch.float64, device=device)
    for i, t in enumerate(tensors):
        summarise(local(t), rows[i])
    if dist.is_initialized() and len(tensors):
        sums = rows[:, :2].contiguous()
        _collectives.all_reduce(sums, op=dist.ReduceOp.SUM)
        top = rows[:, 2].contiguous()
        _collectives.all_reduce(top, op=dist.ReduceOp.MAX)
        replicas = torch.tensor([s.replicas for s in shards], dtype=torch.float64, device=device)
        rows = torch.cat([sums / replicas.unsqueeze(1), top.unsqueeze(1)], 1)
    return rows
