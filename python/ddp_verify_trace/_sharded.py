"""Parameters sharded over the ranks (FSDP2's DTensors): what a trace needs of them, read as
the whole tensor would be, with as little traffic as that allows.

Whole traces gather each whole gradient and weight (`full_tensor()`, an all-gather; small
models). Sampled traces never do: each rank takes the kept positions that fall in its own
shard and one all-reduce puts them together (each position has one owner), and each whole
tensor's float64 [sum, sum of squares, max |x|] is its shards' sums added up and their
maxima's maximum. Every call here is a collective: every rank makes the same ones, in the
same order (the recorder's step and close run on every rank).

Ranks hold different shards by design, so no per-rank checksum of a shard is recorded; what
must agree (the gathered gradient, every rank stepping) is checked from the gathered tensor.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.distributed as dist


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
    dist.all_gather(parts, mine, group=mesh.get_group())
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
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
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
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        top = rows[:, 2].contiguous()
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        replicas = torch.tensor([s.replicas for s in shards], dtype=torch.float64, device=device)
        rows = torch.cat([sums / replicas.unsqueeze(1), top.unsqueeze(1)], 1)
    return rows
