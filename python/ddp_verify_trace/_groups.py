"""Every optimizer's param groups as a trace holds them (`groups.<step>`, rows of
`_schema.GROUP_FIELDS`): the settings each step's update ran with, group by group, so two
runs can be held to the same settings (a second group's warm-up, a weight decay of its own)
before their numbers are weighed."""
from __future__ import annotations

from typing import Any

import torch

from . import _schema

_NAN = float("nan")


def _number(value: Any) -> float:
    """A setting as a float; NaN where the group has none (or one that is no number)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _NAN
    return float(value)


def row(optimizer: int, index: int, group: dict[str, Any], params: float | None = None) -> list[float]:
    """One group's row. `params`: its parameter count where `group["params"]` does not say it
    (an engine's flat partition)."""
    betas = group.get("betas")
    beta1, beta2 = (betas[0], betas[1]) if isinstance(betas, (tuple, list)) and len(betas) >= 2 else (None, None)
    if params is None:
        held = group.get("params")
        params = float(len(held)) if isinstance(held, (list, tuple)) else _NAN
    values = {
        "optimizer": float(optimizer),
        "group": float(index),
        "params": params,
        "lr": _number(group.get("lr")),
        "weight_decay": _number(group.get("weight_decay")),
        "beta1": _number(beta1),
        "beta2": _number(beta2),
        "eps": _number(group.get("eps")),
        "momentum": _number(group.get("momentum")),
    }
    return [values[f] for f in _schema.GROUP_FIELDS]


def rows(optimizers: list[list[tuple[dict[str, Any], float | None]]]) -> torch.Tensor:
    """The flat float64 rows of every optimizer's groups, each optimizer's (group, params
    count or None) in order: index 0 the recorded optimizer's."""
    flat = [v for k, groups in enumerate(optimizers) for i, (g, n) in enumerate(groups) for v in row(k, i, g, n)]
    return torch.tensor(flat, dtype=torch.float64)
