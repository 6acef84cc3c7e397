"""How a run's samples were dealt, as trace header facts: DistributedSampler's padding (the
samples it repeats so that W shards are equal) or dropping, and a loader's last batch,
short or dropped. Facts of this rank; the recorder writes them over all ranks. What
`explore` meets at an N off a multiple of W or of W x B."""
from __future__ import annotations

from typing import Any

import torch

from ._schema import Key as K

# Repeated indices named in a trace, at most.
_NAMED = 16


def sampler(s: Any) -> dict[str, Any]:
    """A DistributedSampler's deal for this epoch (torch's own arithmetic, read back)."""
    n = len(s.dataset)
    facts: dict[str, Any] = {K.SAMPLER_DATASET: n}
    if s.drop_last:
        facts[K.SAMPLER_DROPPED] = max(n - s.total_size, 0)
        return facts
    pad = max(s.total_size - n, 0)
    facts[K.SAMPLER_PADDED] = pad
    if pad and n:
        # DistributedSampler appends the order's first `pad` indices (cycled where pad > n).
        if s.shuffle:
            g = torch.Generator()
            g.manual_seed(s.seed + s.epoch)
            order = torch.randperm(n, generator=g)[: min(pad, _NAMED, n)].tolist()
        else:
            order = list(range(min(pad, _NAMED, n)))
        facts[K.SAMPLER_REPEATED] = ",".join(str(order[i % len(order)]) for i in range(min(pad, _NAMED)))
    return facts


def loader(samples: int, batch: int, drop_last: bool) -> dict[str, Any]:
    """A batch sampler's last batch over `samples`: dropped, or kept short."""
    short = samples % batch
    return {K.LOADER_DROPPED: short if drop_last else 0, K.SHORT_BATCHES: int(bool(short) and not drop_last)}


def shard(s: Any) -> dict[str, Any]:
    """Accelerate's BatchSamplerShard (how Trainer and Accelerate deal batches to ranks): with
    even_batches (its default) the last round of W batches is completed with samples from
    the start, so every rank's batches are full."""
    inner = s.batch_sampler
    n, b, w = len(inner.sampler), inner.batch_size, s.num_processes
    if w <= 1:
        return {}
    per_round = b if s.split_batches else b * w
    rem = n % per_round
    facts: dict[str, Any] = {K.SAMPLER_DATASET: n}
    if s.even_batches and not inner.drop_last:
        # Full batches on every rank: what the inner sampler would call short is filled.
        facts.update({K.SAMPLER_PADDED: (per_round - rem) % per_round, K.SHORT_BATCHES: 0, K.LOADER_DROPPED: 0})
    return facts


def batches(order: list[list[int]], batch: int) -> dict[str, Any]:
    """Our AccumulationBatchSampler's micro-batches: every rank's short last batch is one."""
    return {K.LOADER_DROPPED: 0, K.SHORT_BATCHES: sum(1 for b in order if len(b) < batch)}


def header(deal: dict[str, Any], world: int) -> dict[str, str]:
    """The facts as header values: a loader's counts are this rank's, so over W ranks (each
    DistributedSampler shard is as long as the others) they are W times as many."""
    out = {}
    for k, v in deal.items():
        if k in (K.LOADER_DROPPED, K.SHORT_BATCHES):
            v = v * world
        if v:  # counts are at least 1: none is said by leaving the key out
            out[k] = str(v)
    return out
