"""A step's stage facts of every rank, gathered in the step's one collective (`Exchange`)."""
from __future__ import annotations

import torch

from .. import _collectives
from .batches import FIELDS


class Exchange:
    """A step's stage facts of every rank in one all_gather of one float64 payload per rank:
    its local sums (`LocalSums.take`), its row count and its rows, up to `capacity` of them;
    the recorder sends it with the step's rank checksums where it gathers those (one
    collective for both). Every rank sees every count, so where one had more rows than the
    capacity all make the same second all_gather of the rows at the larger capacity, kept
    for the steps after. (On gloo an all_gather of a small tensor costs about a quarter of an
    all_reduce's time, and half of an all_gather_object's, which pickles and makes two.)"""

    def __init__(self) -> None:
        self.capacity = 4  # rows per rank

    def pack(self, rows: list[list[float]], local: torch.Tensor, device: torch.device) -> Packed:
        """This rank's step, and the payload every rank gathers."""
        width = len(FIELDS)
        mine = torch.tensor([v for r in rows for v in r], dtype=torch.float64)
        n, cap = local.numel(), self.capacity
        payload = torch.zeros(n + 1 + cap * width, dtype=torch.float64, device=device)
        payload[:n] = local
        payload[n] = float(len(rows))
        first = mine[: cap * width]
        payload[n + 1 : n + 1 + first.numel()] = first.to(device)
        return Packed(mine, local, payload)

    def finish(self, packed: Packed, every: torch.Tensor | None, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(every rank's rows in rank order, flat; the local sums added over ranks), on the
        host, from every rank's payload ([world, len], on the host; None in one process)."""
        if every is None:
            return packed.mine, packed.local.cpu()
        width, n = len(FIELDS), packed.local.numel()
        counts = [int(c) for c in every[:, n].tolist()]
        part = every[:, n + 1 :]
        if max(counts) > self.capacity:
            self.capacity = cap = max(counts)
            again = torch.zeros(cap * width, dtype=torch.float64, device=packed.payload.device)
            again[: packed.mine.numel()] = packed.mine.to(again.device)
            part = all_gather(again, world)
        flat = torch.cat([part[r, : counts[r] * width] for r in range(world)])
        return flat, every[:, :n].sum(0)


class Packed:
    """One rank's step as `Exchange.pack` made it."""

    def __init__(self, mine: torch.Tensor, local: torch.Tensor, payload: torch.Tensor) -> None:
        self.mine, self.local, self.payload = mine, local, payload


def all_gather(t: torch.Tensor, world: int) -> torch.Tensor:
    """[world, len(t)] on the host."""
    out = [torch.empty_like(t) for _ in range(world)]
    _collectives.all_gather(out, t)
    return torch.stack(out).cpu()
