"""Each micro-batch's row of stage facts on one rank, as the patches saw it on its way to
backward (`Batches`), kept as tensors until the step (no device sync per micro-batch)."""
from __future__ import annotations

import math
from typing import Any

import torch

from .. import _schema
from .fingerprint import Seen
from .loss import peel_to, reduction

FIELDS = _schema.BATCH_FIELDS
# What a row carries between the ranks: its fields, then its micro-batch's autocast (written
# apart, as `autocast.<s>`: traces before it read the same rows).
WIRE = (*FIELDS, "autocast")
# Autocast's dtype as a number: its significand's digits (0: off).
_DIGITS = {torch.bfloat16: 8.0, torch.float16: 11.0, torch.float32: 24.0, torch.float64: 53.0}
_MASK = (1 << 52) - 1  # fingerprints are kept exact in float64
_NAN = float("nan")
_WRAP = (1 << 64) - 1  # host fingerprints combined wrap as int64 tensors do


class Batches:
    """One rank's micro-batches since the last step, as the patches saw them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._inputs: Any = None  # fingerprints of the forwards since the last backward
        self._rows: list[torch.Tensor] = []  # their rows' hashes
        self._every = 1
        self._norm: Any = None
        self._loss: Any = None
        self._loss_fn: Any = None  # the returned loss's graph node: was the root made from it?
        self._handed: Any = None
        self.handed_by: str | None = None  # who handed the loss to a framework API, or called backward
        self.backward_by: str | None = None  # whose code called torch's backward
        self.api: str | None = None  # the framework whose backward API took the loss
        self.normalised_by: str | None = None
        self._reductions: set[str | None] = set()  # how each backward's loss reduced its micro-batch
        self.loss_dtype: torch.dtype | None = None  # the narrowest value backward ran on
        self._autocast = _NAN  # the digits of this micro-batch's autocast (0: off; NaN: unseen)
        self.samples_from: str | None = None  # what the sample hashes were taken from ("mixed": several kinds)

    def forward(self, fp: Seen | None, norm: Any, who: str | None) -> None:
        if fp is not None:
            # Several outermost calls in one micro-batch: their fingerprints in order, their
            # rows together.
            both = fp.whole if self._inputs is None else self._inputs * 1000003 + fp.whole
            self._inputs = both & _WRAP if isinstance(both, int) else both
            if fp.rows is not None:
                self._rows.append(fp.rows)
                self._every = max(self._every, fp.every)
                if fp.kind and self.samples_from != fp.kind:
                    self.samples_from = fp.kind if self.samples_from is None else "mixed"
        if norm is not None:
            self._norm = norm
            if who is not None:
                self.normalised_by = who
        self._loss = self._loss_fn = None

    def precision(self, autocast: torch.dtype | None) -> None:
        """This micro-batch's outermost forward ran under autocast in `autocast` (None: off)."""
        self._autocast = 0.0 if autocast is None else _DIGITS.get(autocast, _NAN)

    def returned(self, loss: torch.Tensor | None) -> None:
        if loss is not None:
            # A copy: the trainer may scale the returned tensor in place after the forward
            # (Transformers' `loss *= num_processes`), which would rewrite a view of it.
            self._loss, self._loss_fn = loss.detach().clone(), loss.grad_fn

    def handed(self, loss: Any, api: str, who: str) -> None:
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._handed = loss.detach()
            self.api, self.handed_by = api, who

    def backward(self, root: torch.Tensor, who: str) -> None:
        self.backward_by = who
        if self._handed is None:
            self.handed_by = who
        path: list[Any] = []
        factor, node = peel_to(root, path)
        if self._loss is not None and not any(n is self._loss_fn for n in path):
            # The root was not made from what the forward returned (a trainer that computes
            # its own loss from the logits, TRL's): the peeled loss is the one backward took.
            self._loss = None
        self._loss_fn = None
        if self.loss_dtype is None or root.dtype.itemsize < self.loss_dtype.itemsize:
            self.loss_dtype = root.dtype
        if len(self._reductions) < 2:
            self._reductions.add(reduction(node))
        self.rows.append(
            {"fingerprint": self._inputs, "normaliser": self._norm, "forward": self._loss,
             "root": root.detach(), "factor": factor, "handed": self._handed,
             "samples": self._rows, "every": self._every, "autocast": self._autocast}  # fmt: skip
        )
        self._autocast = _NAN
        self._inputs = self._norm = self._loss = self._handed = None
        self._rows, self._every = [], 1

    @property
    def loss_reduction(self) -> str | None:
        """"mean" or "sum" where every backward's loss so far reduced its micro-batch so."""
        return next(iter(self._reductions)) if len(self._reductions) == 1 else None

    def take(self, rank: int) -> tuple[list[list[float]], list[float]]:
        """The rows since the last take, as numbers (the one sync of the step's facts), and
        their samples' hashes in row order (`samples` of each row)."""
        rows, self.rows = self.rows, []
        out: list[list[float]] = []
        hashes: list[float] = []
        for r in rows:
            kept = _kept(r["samples"], r["every"])
            out.append(_row(rank, r, len(kept) if kept is not None else None))
            hashes.extend(kept or ())
        return out, hashes


def _kept(parts: list[torch.Tensor], every: int) -> list[float] | None:
    """A micro-batch's samples' hashes kept (exact in float64: 52 bits), 1 in `every` by
    value; None where none were taken."""
    if not parts:
        return None
    try:
        values = torch.cat([p.reshape(-1).cpu() for p in parts]).tolist()
    except Exception:  # noqa: BLE001 - rows on devices that cannot meet: not taken
        return None
    return [float(v & _MASK) for v in values if (v & _MASK) % every == 0]


def _number(v: Any) -> float:
    if v is None:
        return _NAN
    if isinstance(v, torch.Tensor):
        return float(v.detach().item())
    return float(v)


def _row(rank: int, r: dict[str, Any], samples: int | None) -> list[float]:
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
        "samples": float(samples) if samples is not None else _NAN,
        "every": float(r["every"]) if samples is not None else _NAN,
        "autocast": float(r.get("autocast", _NAN)),
    }
    return [values[f] for f in WIRE]
