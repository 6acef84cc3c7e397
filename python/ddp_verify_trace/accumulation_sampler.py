"""The one-process leg's sampler: it deals the samples W ranks of torch's DistributedSampler
would see, so that every window of K micro-batches holds exactly the samples of one DDP
optimizer step (shuffle, seed, set_epoch, drop_last and padding included). The Python face
of `ddp-verify split`; a test holds the two identical.

    sampler = AccumulationBatchSampler(len(dataset), world=W, batch_size=B, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler)   # then accumulate K = W x K/W micro-batches
    for epoch in ...: sampler.set_epoch(epoch)
"""
from __future__ import annotations

import os
from typing import Any, Iterator

from torch.utils.data import DistributedSampler

from . import _deal, _watch


class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def shards(
    size: int, world: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, drop_last: bool = False
) -> list[list[int]]:
    """`list(DistributedSampler(...))` for each rank: torch's own sampler, W times."""
    out = []
    for rank in range(world):
        # Any Sized does for a dataset here: the sampler only takes its length.
        data: Any = _Sized(size)
        s: DistributedSampler[int] = DistributedSampler(
            data, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def accumulation_order(
    size: int, world: int, batch_size: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0, drop_last: bool = False
) -> list[list[int]]:
    """The one-process leg's micro-batches for one epoch: local batch 0 of every rank, then
    local batch 1, ... Each rank's batches are a DataLoader(batch_size, drop_last=False) over
    its shard, so a rank's short last batch stays a micro-batch of its own."""
    per_rank = [
        [shard[i : i + batch_size] for i in range(0, len(shard), batch_size)]
        for shard in shards(size, world, shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last)
    ]
    most = max((len(b) for b in per_rank), default=0)
    return [batches[i] for i in range(most) for batches in per_rank if i < len(batches)]


class AccumulationBatchSampler:
    """A batch sampler (`DataLoader(batch_sampler=...)`) yielding `accumulation_order`;
    call set_epoch(epoch) each epoch, as on DistributedSampler."""

    def __init__(
        self, size: int, *, world: int, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> None:
        if world < 1 or batch_size < 1:
            raise ValueError("AccumulationBatchSampler: world and batch_size must be at least 1")
        # The big batch's leg of `ddp-verify -- COMMAND` gives the script K·B: one batch per
        # step must be the union of that step's K micro-batches of B, so they are dealt at
        # B and merged K at a time.
        self.merge = 1
        k = int(os.environ.get("DDP_VERIFY_ACC_STEPS", "1") or 1)
        if os.environ.get("DDP_VERIFY_LEG") == "big-batch" and k > 1 and batch_size % k == 0:
            self.merge, batch_size = k, batch_size // k
        self.size, self.world, self.batch_size = size, world, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        # Frameworks set the epoch on `batch_sampler.sampler` (Lightning does).
        self.sampler = _Epochs(self)

    def set_epoch(self, epoch: int) -> None:
        """As DistributedSampler's; an open recording notes where the epoch starts."""
        self.epoch = epoch
        _watch.epoch_started(epoch)

    def _order(self) -> list[list[int]]:
        order = accumulation_order(
            self.size, self.world, self.batch_size, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch, drop_last=self.drop_last
        )
        if self.merge == 1:
            return order
        return [[i for b in order[j : j + self.merge] for i in b] for j in range(0, len(order), self.merge)]

    def __iter__(self) -> Iterator[list[int]]:
        order = self._order()
        _watch.dealt(_deal.batches(order, self.batch_size * self.merge))
        return iter(order)

    def __len__(self) -> int:
        return len(self._order())


class _Epochs:
    """The batch sampler's samples one by one, and its set_epoch."""

    def __init__(self, owner: AccumulationBatchSampler) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return (i for batch in self._owner for i in batch)

    def __len__(self) -> int:
        return sum(len(b) for b in self._owner)
