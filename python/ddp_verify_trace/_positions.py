"""Sampled traces: which element positions of a parameter a trace keeps, reading them
without copying the tensor, and each whole tensor's float64 summaries.

Of each parameter of more than N elements a sampled trace keeps N flat positions, drawn from
a fixed seed, the parameter's name and shape (never the data, the rank or the leg), so every
leg and rank keeps the same ones; per step it adds the whole gradient's [sum, sum of squares,
max |g|] in float64.
"""
from __future__ import annotations

import hashlib
import random

import torch


def sample_positions(name: str, shape: tuple[int, ...] | torch.Size, n: int) -> torch.Tensor:
    """The `n` flat positions a sampled trace keeps of parameter `name` of `shape`: int64,
    increasing, on the CPU. They depend on the name and shape alone (a fixed seed hashed with
    them, never the data, the rank or the leg), so every run of the same model keeps the
    same ones, whatever the torch version: drawn with Python's random.Random.random(), whose
    sequence for a seed Python guarantees, not torch's generators (torch.randint's draws
    for one seed differ between torch 2.5 and 2.13). About n draws, whatever the size."""
    numel = 1
    for d in shape:
        numel *= int(d)
    if not 0 < n < numel:
        raise ValueError(f"ddp_verify_trace: {n} positions of {name} with {numel} elements")
    digest = hashlib.blake2b(f"ddp-verify/{name}/{tuple(int(d) for d in shape)}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little") & (2**63 - 1))
    # Where more than half are kept, the ones left out are drawn instead (as few draws).
    want = min(n, numel - n)
    drawn: dict[int, None] = {}  # distinct positions in the order drawn
    while len(drawn) < want:
        drawn[min(int(rng.random() * numel), numel - 1)] = None
    if want == n:
        return torch.tensor(sorted(drawn), dtype=torch.int64)
    keep = torch.ones(numel, dtype=torch.bool)
    keep[torch.tensor(list(drawn), dtype=torch.int64)] = False
    return keep.nonzero().reshape(-1)


def _offsets(positions: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """Where the elements at flat (row-major) `positions` of a tensor of `shape` and
    `strides` lie in its memory, counted from its first element."""
    rest = positions.clone()
    out = torch.zeros_like(positions)
    for size, stride in zip(reversed(shape), reversed(strides)):
        out += (rest % size) * stride
        rest //= size
    return out


class Summaries:
    """Each tensor's [sum, sum of squares, max |x|] over all its elements, in float64, as a
    float64 tensor of 3 on its device (no host sync): chunk by chunk through one reused
    float64 buffer per device, so nothing the size of the tensor is allocated. NaN anywhere
    gives NaN (sum, dot and amax all propagate it)."""

    def __init__(self) -> None:
        self._buffers: dict[torch.device, torch.Tensor] = {}

    @staticmethod
    def _chunk(device: torch.device) -> int:
        # CPU: 2 MB of float64, which stays in cache between the copy and the three reads
        # (bench: 1<<18 beat 1<<16 and 1<<20). GPU: larger, fewer launches.
        return 1 << 22 if device.type != "cpu" else 1 << 18

    def __call__(self, t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Into `out` (float64, 3 elements, on `t`'s device) where given."""
        flat = _memory_order(t.detach())
        n, device = flat.numel(), flat.device
        if out is not None and out.device != device:  # a model spread over devices
            return out.copy_(self(t))
        if out is None:
            out = torch.empty(3, dtype=torch.float64, device=device)
        if n == 0:
            return out.zero_()
        chunk = self._chunk(device)
        buf = self._buffers.get(device)
        if buf is None or buf.numel() < min(chunk, n):
            buf = self._buffers[device] = torch.empty(min(chunk, n), dtype=torch.float64, device=device)
        count = -(-n // chunk)
        # One chunk: straight into `out`; more: each chunk's into a row, then added up.
        parts = out.view(1, 3) if count == 1 else torch.empty(count, 3, dtype=torch.float64, device=device)
        for i in range(count):
            src = flat[i * chunk : (i + 1) * chunk]
            b = buf[: src.numel()]
            b.copy_(src)
            torch.sum(b, 0, out=parts[i, 0])
            torch.dot(b, b, out=parts[i, 1])
            torch.amax(b.abs_(), 0, out=parts[i, 2])
        if count > 1:
            torch.sum(parts[:, :2], 0, out=out[:2])
            torch.amax(parts[:, 2], 0, out=out[2])
        return out

    def clear(self) -> None:
        self._buffers = {}


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """All of `t`'s elements once each as a 1-D tensor: a view in memory order where `t` is
    dense (contiguous, or a permutation of contiguous such as channels_last), else a copy."""
    if t.is_contiguous():
        return t.reshape(-1)
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    permuted = t.permute(order)
    return permuted.reshape(-1) if permuted.is_contiguous() else t.reshape(-1)


class Sampling:
    """The positions kept of each sampled parameter (on its device, and on the host for the
    trace), and reads of them in place."""

    def __init__(self, size: int | None, shapes: dict[str, tuple[int, ...]], devices: dict[str, torch.device]) -> None:
        # N, or None: whole tensors.
        self.size = size
        self.cpu: dict[str, torch.Tensor] = {}
        self.positions: dict[str, torch.Tensor] = {}
        self._offsets: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
        if size is not None:
            for n, shape in shapes.items():
                if numel(shape) > size:
                    self.cpu[n] = sample_positions(n, shape, size)
                    self.positions[n] = self.cpu[n].to(devices[n])

    def __contains__(self, name: str) -> bool:
        return name in self.positions

    def count(self, name: str) -> int:
        return self.positions[name].numel()

    def take(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """`t`'s elements at `name`'s positions (1-D, in their order), read in place: one
        gather, never a copy of `t`, whatever its strides (channels_last, a bucket's view,
        an expanded gradient)."""
        pos = self.positions[name]
        if pos.device != t.device:
            pos = self.positions[name] = pos.to(t.device)
        if t.is_contiguous():
            return t.reshape(-1).index_select(0, pos)
        strides = tuple(t.stride())
        cached = self._offsets.get(name)
        if cached is None or cached[0] != strides or cached[1].device != t.device:
            cached = self._offsets[name] = (strides, _offsets(pos, tuple(t.shape), strides))
        span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, strides))
        return t.as_strided((span,), (1,)).index_select(0, cached[1])

    def kept_shape(self, name: str, p: torch.Tensor) -> tuple[int, ...]:
        return (self.positions[name].numel(),) if name in self.positions else tuple(p.shape)

    def kept(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """What a trace keeps of `t`, a tensor of parameter `name`: its positions' elements
        where it is sampled, else all of it."""
        return self.take(name, t) if name in self.positions else t


def to_host(
    sampled: list[tuple[str, torch.Tensor, torch.Tensor | None]], summaries: torch.Tensor, dtype: torch.dtype
) -> list[tuple[str, torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """The sampled parameters' small tensors on the host, in one copy from the device:
    packed as float64 (which holds every float32, bfloat16 and float16 value exactly),
    moved, split, and the samples and magnitudes cast back to the trace's dtype (a value
    cast there rounds as it would have from where it was summed)."""
    if not sampled:
        return []
    device = summaries.device
    parts = [summaries.reshape(-1)]
    for _, kept, scale in sampled:
        parts += [kept.reshape(-1).to(device)] + ([] if scale is None else [scale.reshape(-1).to(device)])
    # cat promotes every part to float64 in the one kernel.
    wide = torch.cat(parts).cpu()
    rows = wide[: summaries.numel()].view(-1, 3).clone()  # kept apart from the step's buffer
    narrow = wide[summaries.numel() :].to(dtype)
    out = []
    at = 0
    for i, (n, kept, scale) in enumerate(sampled):
        values = narrow[at : at + kept.numel()]
        at += kept.numel()
        moved = None
        if scale is not None:
            moved = narrow[at : at + scale.numel()]
            at += scale.numel()
        out.append((n, values, moved, rows[i]))
    return out
