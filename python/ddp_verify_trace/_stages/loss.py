"""The loss on its way to backward: the normaliser a forward was passed, the loss it
returned, and the constant factors that scaled it before backward (peeled off the graph)."""
from __future__ import annotations

from typing import Any

import torch


def normaliser(kwargs: dict[str, Any]) -> Any:
    """The `num_items_in_batch` a forward was passed (Transformers' Trainer), else None."""
    n = kwargs.get("num_items_in_batch")
    return n if isinstance(n, (int, float, torch.Tensor)) else None


def forward_loss(out: Any) -> torch.Tensor | None:
    """The scalar loss a forward returned (a tensor, or a ModelOutput's or dict's `loss`), its
    graph kept: whether backward's root was made from it is told there (`peel_to`'s path)."""
    loss = out if isinstance(out, torch.Tensor) else None
    if loss is None:
        try:
            loss = out["loss"] if isinstance(out, dict) or hasattr(out, "keys") else getattr(out, "loss", None)
        except (KeyError, TypeError, IndexError):
            loss = None
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
        return loss
    return None


def peel(root: torch.Tensor) -> Any:
    """The product of the constant scalar factors at the top of `root`'s graph (x * c, x / c,
    c * x): what scaled the loss before backward. 1.0 where none; a float where every factor
    is on the host (a Python number's is), else a tensor (no device sync per micro-batch)."""
    return peel_to(root)[0]


# Nodes that reduce a loss over its elements, and how (`reduction`): torch's own losses save
# their reduction (at::Reduction: 1 mean, 2 sum).
_MEAN_NODES = ("MeanBackward0", "MeanBackward1")
_SUM_NODES = ("SumBackward0", "SumBackward1")
# The data-parallel wrapper's node over its forward's outputs (torch's `_DDPSink`): looked past.
_SINK = "_DDPSinkBackward"
# Nodes that hand their one input's gradient on unchanged in value: looked past.
_SAME = ("ToCopyBackward0", "CloneBackward0", "ViewBackward0", "AliasBackward0", "SqueezeBackward0",
         "SqueezeBackward1", "UnsqueezeBackward0")  # fmt: skip


def reduction(node: Any) -> str | None:
    """How the loss under the constant factors reduced its micro-batch: "mean", "sum", or
    None where it is no plain reduction (a sum of losses, label smoothing's mix)."""
    if node is None:
        return None
    kind = type(node).__name__
    if kind in _MEAN_NODES:
        return "mean"
    if kind in _SUM_NODES:
        return "sum"
    saved = getattr(node, "_saved_reduction", None)
    return {1: "mean", 2: "sum"}.get(saved) if isinstance(saved, int) else None


def peel_to(root: torch.Tensor, path: list[Any] | None = None) -> tuple[Any, Any]:
    """`peel`'s factor, and the node under the factors (the loss as the forward made it);
    `path`, where given, gets every node passed on the way down, that one included."""
    factor: Any = 1.0
    node, nr = root.grad_fn, root.output_nr
    for _ in range(16):
        if node is None:
            break
        if path is not None:
            path.append(node)
        kind = type(node).__name__  # node.name() costs the backward more (measured)
        if kind in _SAME:
            # A copy to another device or dtype, or a view: the same loss (TRL's `.to(device)`).
            nexts = node.next_functions
            if len(nexts) != 1 or nexts[0][0] is None:
                break
            node, nr = nexts[0]
            continue
        if kind == _SINK:
            # DDP passes its forward's outputs through one node (find_unused_parameters,
            # a static graph's first step): the loss is its output `nr`, input `nr` under it.
            try:
                node, nr = node.next_functions[nr]
            except (IndexError, RuntimeError):
                break
            continue
        if kind not in ("MulBackward0", "DivBackward0"):
            break
        nexts = node.next_functions
        live = [i for i, (f, _) in enumerate(nexts) if f is not None]
        if len(live) != 1:
            break
        try:
            if kind == "DivBackward0":
                if live != [0]:
                    break
                c = node._saved_other
            else:
                c = node._saved_other if live == [0] else node._saved_self
            if not isinstance(c, torch.Tensor) or c.numel() != 1:
                break
        except RuntimeError:  # saved tensors freed (a graph already run): nothing to peel
            break
        v: Any = c.item() if c.is_cpu else c.detach().double()
        factor = _divide(factor, v) if kind == "DivBackward0" else factor * v
        node, nr = nexts[live[0]]
    if path is not None and node is not None and (not path or path[-1] is not node):
        path.append(node)
    return factor, node


def _divide(a: Any, b: Any) -> Any:
    try:
        return a / b
    except ZeroDivisionError:  # as a tensor divides: inf, -inf or nan
        return float(torch.tensor(a, dtype=torch.float64) / b)
