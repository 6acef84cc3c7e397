"""A step's stage facts of every rank, gathered in the step's one collective (`Exchange`)."""
from __future__ import annotations

import torch

from .. import _collectives
from .batches import WIRE


class Exchange:
    """A step's stage facts of every rank in one all_gather of one float64 payload per rank:
    its local sums (`LocalSums.take`), the length of its part, and its part up to `capacity`
    numbers: its row count, its rows, its samples' hashes;
    the recorder sends it with the step's rank checksums where it gathers those (one
    collective for both). Every rank sees every count, so where one had more rows than the
    capacity all make the same second all_gather of the parts at the larger capacity, kept
    for the steps after. (On gloo an all_gather of a small tensor costs about a quarter of an
    all_reduce's time, and half of an all_gather_object's, which pickles and makes two.)"""

    def __init__(self) -> None:
        self.capacity = 64  # numbers per rank

    def pack(self, step: tuple[list[list[float]], list[float]], local: torch.Tensor, device: torch.device) -> Packed:
        """This rank's step (`Batches.take`), and the payload every rank gathers."""
        rows, hashes = step
        mine = torch.tensor([float(len(rows))] + [v for r in rows for v in r] + hashes, dtype=torch.float64)
        n, cap = local.numel(), self.capacity
        payload = torch.zeros(n + 1 + cap, dtype=torch.float64, device=device)
        payload[:n] = local
        payload[n] = float(mine.numel())
        first = mine[:cap]
        payload[n + 1 : n + 1 + first.numel()] = first.to(device)
        return Packed(mine, local, payload)

    def finish(
        self, packed: Packed, every: torch.Tensor | None, world: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(every rank's rows in rank order, flat, of `batches.<s>`'s fields; each row's
        autocast, where any was seen; their samples' hashes in the same order; the local sums
        added over ranks), on the host, from every rank's payload ([world, len], on the host;
        None in one process)."""
        if every is None:
            rows, hashes = _split(packed.mine)
            return (*_columns(rows), hashes, packed.local.cpu())
        n = packed.local.numel()
        counts = [int(c) for c in every[:, n].tolist()]
        part = every[:, n + 1 :]
        if max(counts) > self.capacity:
            self.capacity = cap = max(counts)
            again = torch.zeros(cap, dtype=torch.float64, device=packed.payload.device)
            again[: packed.mine.numel()] = packed.mine.to(again.device)
            part = all_gather(again, world)
        split = [_split(part[r, : counts[r]]) for r in range(world)]
        rows = torch.cat([r for r, _ in split])
        hashes = torch.cat([h for _, h in split])
        return (*_columns(rows), hashes, every[:, :n].sum(0))


def _columns(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Wire rows, flat, as `batches.<s>`'s rows (flat) and their autocast column (None where
    no forward ran under autocast: nothing to compare, nothing written)."""
    if not rows.numel():
        return rows, None
    wire = rows.view(-1, len(WIRE))
    autocast = wire[:, -1].contiguous()
    on = bool((autocast.nan_to_num(0.0) != 0).any())
    return wire[:, :-1].reshape(-1), (autocast if on else None)


def _split(mine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's part as (its rows, flat; its samples' hashes)."""
    if not mine.numel():
        return mine, mine
    width = len(WIRE)
    end = 1 + int(mine[0].item()) * width
    return mine[1:end], mine[end:]


class Packed:
    """One rank's step as `Exchange.pack` made it."""

    def __init__(self, mine: torch.Tensor, local: torch.Tensor, payload: torch.Tensor) -> None:
        self.mine, self.local, self.payload = mine, local, payload


def all_gather(t: torch.Tensor, world: int) -> torch.Tensor:
    """[world, len(t)] on the host."""
    out = [torch.empty_like(t) for _ in range(world)]
    _collectives.all_gather(out, t)
    return torch.stack(out).cpu()
