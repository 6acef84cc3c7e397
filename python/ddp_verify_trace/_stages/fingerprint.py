"""The fingerprint of a micro-batch's samples: a number that changes with the first tensor
input of its outermost module calls (the bits, shape and order of what the model saw), and
one number per sample (each row along that input's first dimension), so that the judge can
compare a step's samples however they were grouped into micro-batches."""
from __future__ import annotations

import ctypes
import zlib
from typing import Any

import torch

_MIX = 0x9E3779B97F4A7C15 - (1 << 64)  # as int64


def _first(value: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor in args and kwargs that can be fingerprinted, in order (dicts by
    key order, as passed); None where there is none."""
    if isinstance(value, torch.Tensor):
        if value.layout == torch.strided and value.numel() and not value.is_complex():
            return value
        return None
    if depth < 4 and isinstance(value, (list, tuple)):
        for v in value:
            t = _first(v, depth + 1)
            if t is not None:
                return t
    elif depth < 4 and isinstance(value, dict):
        for k in value:
            if k != "num_items_in_batch":
                t = _first(value[k], depth + 1)
                if t is not None:
                    return t
    return None


_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# Rows hashed per call, at most: a larger batch keeps the rows whose hash is 0 modulo the
# power of two `every` that brings it under this (the same rows in every grouping).
ROWS = 512


class Seen:
    """One outermost call's samples: the whole input's fingerprint, its rows' hashes (an
    int64 tensor, on the input's device), 1 in how many rows the judge keeps, and what the
    rows were (`kind`: their dtype and shape, "int64[]" or "float32[8]"): hashes of other
    kinds of rows cannot be matched, whatever samples they stand for."""

    __slots__ = ("whole", "rows", "every", "kind")

    def __init__(self, whole: torch.Tensor | int, rows: torch.Tensor | None, every: int, kind: str = "") -> None:
        self.whole, self.rows, self.every, self.kind = whole, rows, every, kind


def seen(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Seen | None:
    """The samples an outermost call received (`fingerprint` and `rows`); None where no tensor
    was passed."""
    t = _first(args)
    if t is None:
        t = _first(kwargs)
        if t is None:
            return None
    n = t.shape[0] if t.dim() else 1
    every = 1
    while n > ROWS * every:
        every *= 2
    kind = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape[1:])}".replace(" ", "")
    return Seen(_whole(t), rows(t), every, kind)


def rows(t: torch.Tensor) -> torch.Tensor | None:
    """Each row's hash (its bits weighted by position, its shape mixed in): one int64 per row
    along the first dimension, on the tensor's device, without a sync; None where a row is
    empty."""
    if t.dim() < 1 or t.shape[0] == 0:
        return None
    width = t.numel() // t.shape[0]
    if width == 0:
        return None
    m = t.detach().reshape(t.shape[0], width)
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    elif m.is_floating_point():
        m = m.view(_INTS[m.element_size()])
    shape = hash(t.shape[1:]) & 0x7FFFFFFFFFFF
    return (m.to(torch.int64) * _weights(width, m.device)).sum(1).add_(shape)


def fingerprint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | int | None:
    """A number that changes with the first tensor input's bits, shape or order: on the host
    a CRC-32 of its bytes with its shape's hash above it (a Python int: no torch operation,
    the forward's cost on a small model), elsewhere a 0-d int64 tensor on the input's device
    (its values' bit patterns weighted by position: no device sync per micro-batch); None
    where no tensor was passed. Both legs of a run fingerprint alike (one device kind). The
    first tensor only: wrappers pass more than the model sees (Lightning's DDP wrapper the
    whole batch with its labels, the model the inputs alone), and the samples come first
    (input_ids, images). Called once per micro-batch, between a forward's kernels: as few
    Python steps as can be (no detach: nothing here records a graph)."""
    t = _first(args)
    if t is None:
        t = _first(kwargs)
        if t is None:
            return None
    return _whole(t)


def _whole(t: torch.Tensor) -> torch.Tensor | int:
    # The shape mixed in (a torch.Size hashes as its tuple of ints, alike in every process).
    shape = hash(t.shape) & 0x7FFFFFFFFFFF
    if t.is_cpu:
        crc = _host_crc(t)
        if crc is not None:
            return crc | (shape & 0xFFFFF) << 32
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    elif flat.is_floating_point():
        flat = flat.view(_INTS[flat.element_size()])
    weights = _weights(flat.numel(), flat.device)
    return (flat.to(torch.int64) * weights).sum() + shape


def _host_crc(t: torch.Tensor) -> int | None:
    """CRC-32 of a host tensor's bytes in order, read in place through ctypes (torch does
    not require NumPy, nor does the recorder: `_stream._bytes`); None where it cannot be."""
    try:
        if not t.is_contiguous():
            t = t.detach().contiguous()
        size = t.numel() * t.element_size()
        return zlib.crc32((ctypes.c_char * size).from_address(t.data_ptr()))
    except Exception:  # noqa: BLE001 - a tensor without plain memory: the torch way
        return None


_WEIGHTS: dict[tuple[int, Any], torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """Position weights for `n` elements, kept for the few input sizes a run has (a bounded
    cache: varying sequence lengths make a few dozen)."""
    key = (n, device)
    w = _WEIGHTS.get(key)
    if w is None:
        if len(_WEIGHTS) > 64:
            _WEIGHTS.clear()
        w = _WEIGHTS[key] = torch.arange(n, device=device, dtype=torch.int64).mul_(_MIX).add_(1)
    return w
