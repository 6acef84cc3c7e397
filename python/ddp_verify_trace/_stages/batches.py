"""Each micro-batch's row of stage facts on one rank, as the patches saw it on its way to
backward (`Batches`), kept as tensors until the step (no device sync per micro-batch)."""
from __future__ import annotations

import math
from typing import Any

import torch

from .. import _schema
from .loss import peel

FIELDS = _schema.BATCH_FIELDS
_MASK = (1 << 52) - 1  # fingerprints are kept exact in float64
_NAN = float("nan")
_WRAP = (1 << 64) - 1  # host fingerprints combined wrap as int64 tensors do


class Batches:
    """One rank's micro-batches since the last step, as the patches saw them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._inputs: Any = None  # fingerprints of the forwards since the last backward
        self._norm: Any = None
        self._loss: Any = None
        self._handed: Any = None
        self.handed_by: str | None = None  # who handed the loss to a framework API, or called backward
        self.backward_by: str | None = None  # whose code called torch's backward
        self.api: str | None = None  # the framework whose backward API took the loss
        self.normalised_by: str | None = None

    def forward(self, fp: torch.Tensor | None, norm: Any, who: str | None) -> None:
        if fp is not None:
            # Several outermost calls in one micro-batch: their fingerprints in order.
            both = fp if self._inputs is None else self._inputs * 1000003 + fp
            self._inputs = both & _WRAP if isinstance(both, int) else both
        if norm is not None:
            self._norm = norm
            if who is not None:
                self.normalised_by = who
        self._loss = None

    def returned(self, loss: torch.Tensor | None) -> None:
        if loss is not None:
            self._loss = loss

    def handed(self, loss: Any, api: str, who: str) -> None:
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._handed = loss.detach()
            self.api, self.handed_by = api, who

    def backward(self, root: torch.Tensor, who: str) -> None:
        self.backward_by = who
        if self._handed is None:
            self.handed_by = who
        self.rows.append(
            {"fingerprint": self._inputs, "normaliser": self._norm, "forward": self._loss,
             "root": root.detach(), "factor": peel(root), "handed": self._handed}  # fmt: skip
        )
        self._inputs = self._norm = self._loss = self._handed = None

    def take(self, rank: int) -> list[list[float]]:
        """The rows since the last take, as numbers (the one sync of the step's facts)."""
        rows, self.rows = self.rows, []
        return [_row(rank, r) for r in rows]


def _number(v: Any) -> float:
    if v is None:
        return _NAN
    if isinstance(v, torch.Tensor):
        return float(v.detach().item())
    return float(v)


def _row(rank: int, r: dict[str, Any]) -> list[float]:
    root = _number(r["root"])
    factor = _number(r["factor"])
    fp = r["fingerprint"]
    values = {
        "rank": float(rank),
        "fingerprint": float(int(fp) & _MASK) if fp is not None else _NAN,
        "forward": _number(r["forward"]),
        "peeled": root / factor if factor not in (0.0,) and math.isfinite(factor) else _NAN,
        "root": root,
        "handed": _number(r["handed"]),
        "normaliser": _number(r["normaliser"]),
    }
    return [values[f] for f in FIELDS]
