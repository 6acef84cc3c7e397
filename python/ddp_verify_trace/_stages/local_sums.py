"""Each backward's own gradient on one rank, summed per parameter before any reduction
(`LocalSums`): what the judge compares a reduced gradient with."""
from __future__ import annotations

from typing import Any

import torch

# Half-precision gradients are summed in float32, so that many terms keep their sum.
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_FOLD_AT = 1 << 14  # sums kept before they are folded, one per parameter


class LocalSums:
    """Per parameter, the sum of every backward's own gradient since the step, before any
    reduction, in float64 on the gradient's device."""

    def __init__(self) -> None:
        # Each backward's sum of each parameter, by the parameter's id, in at least float32
        # (a float64 sum of a float32 tensor costs several times more): one operation per
        # parameter per backward, added up at the step in two for all of them (an in-place
        # add per backward cost a small model's forward and backward 4% more, measured).
        self._keys: list[int] = []
        self._sums: list[torch.Tensor] = []
        # The parameters' order the sums are taken in, and each one's slot by id.
        self._order: tuple[Any, dict[int, int]] = (None, {})
        # The slots of the last step's keys, as a tensor: the same keys in the same order
        # step after step (backward runs in one order), so it is made once.
        self._index: tuple[list[int], torch.Tensor | None] = ([], None)

    def add(self, key: int, grad: torch.Tensor) -> None:
        # Called for every parameter of every backward: as few operations as can be.
        wide = _WIDER.get(grad.dtype)
        if grad.requires_grad:  # a backward with create_graph
            grad = grad.detach()
        self._keys.append(key)
        sums = self._sums
        sums.append(grad.sum() if wide is None else grad.sum(dtype=wide))
        if len(sums) >= _FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        """Many backwards without a step: one sum per parameter so far (memory stays bounded)."""
        folded: dict[int, torch.Tensor] = {}
        for k, t in zip(self._keys, self._sums):
            got = folded.get(k)
            folded[k] = t if got is None else got + t
        self._keys, self._sums = list(folded), list(folded.values())

    def clear(self) -> None:
        self._keys, self._sums = [], []

    def take(self, params: list[tuple[str, Any]], device: torch.device) -> torch.Tensor:
        """This rank's sums since the step in float64 on `device`: first 1.0 where a backward
        was seen (else 0.0), then one per parameter of `params`, in order."""
        keys, sums = self._keys, self._sums
        self.clear()
        out = torch.zeros(1 + len(params), dtype=torch.float64, device=device)
        if not sums:
            return out
        out[0] = 1.0
        if self._order[0] is not params:  # the recorder passes the same list every step
            self._order = (params, {id(p): i + 1 for i, (_, p) in enumerate(params)})
            self._index = ([], None)
        where = self._order[1]
        last, index = self._index
        if keys != last or index is None or index.device != device:
            if not all(k in where for k in keys):  # parameters the recorder does not keep
                kept = [(k, t) for k, t in zip(keys, sums) if k in where]
                keys, sums = [k for k, _ in kept], [t for _, t in kept]
                if not keys:
                    return out
            index = torch.tensor([where[k] for k in keys], dtype=torch.int64, device=device)
            self._index = (keys, index)
        try:  # dtypes promote; devices must agree
            values = torch.stack(sums)
        except RuntimeError:
            values = torch.stack([t.to(device, torch.float64) for t in sums])
        return out.index_add_(0, index, values.to(device, torch.float64))
