"""The precision control (`_schema.DIVISOR_ENV`): DDP's ranks divide each micro-batch's loss
by K/W where one process divides by K, so in a narrow dtype (bfloat16 autocast, float16, a
bfloat16 model) every op of the backward rounds at another scale unless W is a power of
two, and no bound on paper covers a whole backward rounding anew. ddp-verify measures it:
the one-process leg runs once more with each backward seeded with W instead of 1 (its loss
backpropagated as DDP's ranks backpropagate theirs, loss/(K/W)) and each parameter's
gradient divided by W as it arrives, before it is accumulated (as DDP's average does). Its
distance from the accumulation leg is the legitimate rounding, on this model, at these
magnitudes and this precision (`judge::precision`).

Only what the script's own loss backpropagates is seeded (a one-element root with a graph
and no gradient given). The division sits on every leaf each seeded backward reaches (its
graph's AccumulateGrad nodes), before autograd accumulates into it: the trained modules'
parameters, and the copies an engine computes with in their place, whose gradients the
engine then reduces into its own. Both come out when the last watch closes."""
from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from . import _schema


def factor() -> tuple[float | None, str | None]:
    """(W where the environment asks for the control, else None; a warning line where its
    value is no number above 1, which leaves the run as it is rather than failing it)."""
    text = os.environ.get(_schema.DIVISOR_ENV, "").strip()
    if not text:
        return None, None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value != value or abs(value) == float("inf") or value <= 1:
        return None, f"{_schema.DIVISOR_ENV}={text!r} is no number above 1: the losses were not rescaled"
    return value, None


class Divisor:
    """One control's seeding and hooks."""

    def __init__(self, by: float) -> None:
        self.by = by
        self._hooked: dict[int, weakref.ReferenceType[torch.Tensor]] = {}  # by id, the tensor hooked
        self._handles: list[Any] = []
        self.seeded = 0  # backwards seeded with `by`
        self.divided = 0  # parameter gradients divided back

    def seed(self, root: torch.Tensor) -> torch.Tensor:
        """The gradient a scalar root's backward starts from: W where DDP's ranks start from 1
        with a loss W times as large."""
        self.seeded += 1
        for leaf in leaves(root):
            self._hook(leaf)
        return torch.full_like(root, self.by)

    def hook(self, module: torch.nn.Module) -> None:
        """Each trained parameter's gradient divided by W as each backward makes it."""
        for p in module.parameters():
            self._hook(p)

    def _hook(self, t: torch.Tensor) -> None:
        if not t.requires_grad or t.grad_fn is not None:
            return
        ref = self._hooked.get(id(t))
        if ref is not None and ref() is t:
            return
        self._hooked[id(t)] = weakref.ref(t)
        self._handles.append(t.register_hook(self._divide))

    def _divide(self, grad: torch.Tensor) -> torch.Tensor:
        self.divided += 1
        return grad / self.by

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._hooked = [], {}


def leaves(root: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors a root's backward accumulates into: its graph's AccumulateGrad nodes'
    variables, each once (a walk over the graph's nodes, in the control leg only)."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [root.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            out.append(variable)
            continue
        stack.extend(n for n, _ in getattr(node, "next_functions", ()))
    return out


# The control under way in this process (None: a plain leg), set when torch is patched.
ACTIVE: Divisor | None = None
WARNING: str | None = None


def start() -> None:
    """Reads the environment once, as torch is patched."""
    global ACTIVE, WARNING
    by, WARNING = factor()
    ACTIVE = Divisor(by) if by is not None else None


def stop() -> None:
    global ACTIVE
    if ACTIVE is not None:
        ACTIVE.close()
    ACTIVE = None
