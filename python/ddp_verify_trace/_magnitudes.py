"""Micro-batch magnitudes: the size of each backward's gradient behind a step's gradient,
which rounding differences are measured against where the micro-batches' terms cancel. Kept
per element (the sum of |gradient|) or per tensor (the sum of each backward's max |g|), in at
least float32; under DDP averaged over the ranks as DDP averages gradients."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from . import _collectives
from ._positions import Sampling


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
        # A gradient in a hook needs no detach (one dispatch of two, measured), except under
        # create_graph.
        sums.setdefault(key, []).append(torch.aminmax(grad.detach() if grad.requires_grad else grad))
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


class Backwards:
    """What the backwards since the last optimizer step left, per parameter: how many reached
    it, and their magnitudes as `how` says ("element", "tensor" or None: counted only)."""

    def __init__(self, how: str | None, acc_dtype: torch.dtype) -> None:
        self.how = how
        self.acc_dtype = acc_dtype
        self.sums: dict[str, Any] = {}  # name -> sum of |gradient| of each backward since the last step
        self.counts: dict[str, int] = {}  # name -> backward passes that reached it since the last step

    def add(self, name: str, grad: torch.Tensor, take: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        add_backward(self.sums, self.counts, name, grad, self.how, take)

    def take_counts(self) -> dict[str, int]:
        counts, self.counts = self.counts, {}
        return counts

    def take_early(
        self, sums: dict[str, Any], counts: dict[str, int], sampling: Sampling, params: dict[str, torch.Tensor]
    ) -> None:
        """Magnitudes gathered before the recorder existed (the zero-edit hook's), as
        `magnitudes=` said, before the positions were known. Sampled, they become per
        element: sums per element are gathered at the positions; per-tensor maxima are
        summed and spread over every element kept (an upper bound of each, so sound)."""
        if sampling.size is not None and self.how:
            for n, v in sums.items():
                p = params.get(n)
                if p is None:
                    continue
                if isinstance(v, list):
                    top = _largest_sums([v], self.acc_dtype, p.device)
                    shape = sampling.kept_shape(n, p)
                    v = top.expand(shape).clone() if v else torch.zeros(shape, dtype=self.acc_dtype, device=p.device)
                elif n in sampling:
                    v = sampling.take(n, v)
                self.sums[n] = v
        else:
            self.sums.update(sums)
        self.counts.update(counts)

    def local_largest(self, params: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
        """This rank's per-tensor magnitudes ("tensor"), one per parameter in order, not yet
        averaged over ranks (the recorder gathers them with its step's other facts)."""
        sums = [self.sums.pop(n, None) or [] for n, _ in params]
        return _largest_sums(sums, self.acc_dtype, params[0][1].device)

    def reduced(self, world: int, params: list[tuple[str, torch.Tensor]], sampling: Sampling) -> Any:
        """Each parameter's magnitude sum, averaged over ranks as DDP averages gradients.
        Every rank makes the same all_reduce (zeros where no backward reached a parameter).
        Per tensor under several ranks the recorder gathers `local_largest` instead, with its
        step's other facts (one collective a step)."""
        if self.how == "tensor":
            flat = self.local_largest(params)
            if world > 1:
                _collectives.all_reduce(flat, op=dist.ReduceOp.SUM)
                flat.div_(world)
            return flat
        sums = {n: self.sums.pop(n, None) for n, _ in params}
        sums = {
            n: torch.zeros(sampling.kept_shape(n, p), dtype=self.acc_dtype, device=p.device) if sums[n] is None else sums[n]
            for n, p in params
        }
        if world > 1:
            flat = torch.cat([s.reshape(-1) for s in sums.values()])
            _collectives.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(world)
            parts = flat.split([s.numel() for s in sums.values()])
            sums = {n: part.view(s.shape) for (n, s), part in zip(sums.items(), parts)}
        return sums
