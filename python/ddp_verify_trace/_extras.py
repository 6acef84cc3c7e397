"""What a recording follows beyond the parameters its optimizer trains when it starts:

- the module's other parameters (frozen ones above all): a fine-tune that unfreezes layers
  later applies their gradients from then on, and a trace that dropped them would miss
  those updates. They are followed (their gradients recorded from the step they get one),
  and their final weights written only once they trained, so a frozen base is not dumped;
- the optimizers that step besides the recorded one (`Others`), in the order first seen
  stepping, and their parameters no module name reaches (an uncertainty weight outside the
  model), named `optimizer{k}.{g}.{i}` (optimizer index, group, index in the group), each
  gradient taken as its own optimizer's step finds it (`Others.taken`): a script may reduce
  those by hand between the recorded optimizer's step and theirs."""
from __future__ import annotations

from typing import Any

import torch

Named = list[tuple[str, torch.nn.Parameter]]


def module_rest(module: torch.nn.Module, main: Named, dtype: torch.dtype) -> tuple[Named, Named]:
    """(the module's parameters besides `main` that a trace of `dtype` can hold, those it
    cannot: another dtype)."""
    known = {id(p) for _, p in main} | {n for n, _ in main}
    rest = [(n, p) for n, p in module.named_parameters() if id(p) not in known and n not in known]
    return [(n, p) for n, p in rest if p.dtype == dtype], [(n, p) for n, p in rest if p.dtype != dtype]


class Others:
    """The optimizers that stepped besides the recorded one, and their parameters outside
    the module (`params`, with their peaks |w|): `tracked` are the ids recorded under their
    module names; an optimizer with a parameter neither covers (another dtype, a tensor
    each rank holds a part of, an engine whose parameters hold no gradient) is named `unrecorded`."""

    def __init__(self, tracked: set[int], module: set[int], dtype: torch.dtype, whole: bool) -> None:
        self._tracked, self._module, self._dtype, self._whole = tracked, module, dtype, whole
        self.optimizers: list[torch.optim.Optimizer] = []
        self.params: Named = []
        self.peaks: dict[str, torch.Tensor] = {}
        self.unrecorded: dict[int, str] = {}  # id -> class name
        self._own: dict[int, list[tuple[str, torch.nn.Parameter]]] = {}  # optimizer id -> its params here

    def saw(self, optimizer: torch.optim.Optimizer) -> None:
        if any(o is optimizer for o in self.optimizers):
            return
        self.optimizers.append(optimizer)
        k = len(self.optimizers)  # the recorded optimizer is 0
        have = {id(p) for _, p in self.params}
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                if id(p) in self._tracked or id(p) in have:
                    continue
                in_parts = callable(getattr(p, "to_local", None))  # each rank holds a part
                if id(p) in self._module or not self._whole or in_parts or p.dtype != self._dtype:
                    self.unrecorded[id(optimizer)] = type(optimizer).__name__
                    continue
                name = f"optimizer{k}.{g}.{i}"
                self.peaks[name] = p.detach().abs()  # first: the writer's thread reads them by `params`
                self.params.append((name, p))
                self._own.setdefault(id(optimizer), []).append((name, p))
                have.add(id(p))

    def taken(self, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
        """`optimizer`'s own parameters' gradients as its step is about to apply them, copied."""
        return {n: p.grad.detach().clone() for n, p in self._own.get(id(optimizer), []) if p.grad is not None}

    def track_peaks(self) -> None:
        for n, p in list(self.params):  # maybe on the writer's thread, while `saw` appends
            torch.maximum(self.peaks[n], p.detach().abs(), out=self.peaks[n])

