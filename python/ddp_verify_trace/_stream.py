"""A safetensors file written while training runs.

Each step's gradients are copied into one of two reused buffers and written to disk by a
background thread. Keeping every step in fresh memory was the recorder's main cost: the page
faults of 44 MB of new memory per resnet18 step cost 5x the copy itself. It also grew
without bound on long runs. Small tensors (learning rates, counts, checksums) stay in memory
until `close`.

Layout, which any safetensors reader accepts:
  [8-byte header length][JSON header, padded with spaces][small tensors][streamed tensors]
The streamed tensors start at `RESERVED` bytes into the file. The header and the small
tensors are written into the room before them at close. If they do not fit there, the
streamed bytes are copied once into a new file. Small tensors are placed in order of
increasing item size, ending at an 8-aligned offset, so every tensor's offset in the file
is a multiple of its item size.
"""
from __future__ import annotations

import ctypes
import json
import os
import queue
import struct
import threading
from typing import IO, Any, Callable, Iterable, Sequence

import torch

RESERVED = 1 << 18
# The dtypes a trace holds, by their safetensors names: those ddp-verify reads (floats as
# they are; integers and bools, as buffers hold them, as int64). Others are not written.
_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def writable(dtype: torch.dtype) -> bool:
    """Whether a trace can hold a tensor of `dtype` (not complex, unsigned wider than 8
    bits, float8, ...: a buffer of such a dtype is left out, and the header says so)."""
    return dtype in _NAMES


class Stream:
    """`put` queues big tensors for disk; `keep` holds small ones; `close` writes `path`
    (through `path.part`, renamed: a crash never leaves a half-written trace at `path`).
    `later` runs other work on the writer thread, in order; `settle` waits for all of it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._part = path + ".part"
        self._file = open(self._part, "w+b")
        self._file.seek(RESERVED)
        self._written = 0  # bytes streamed so far
        # name -> (dtype, shape, start, end) within the streamed bytes
        self._entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        self._small: dict[str, torch.Tensor] = {}
        self._free: queue.Queue[torch.Tensor] = queue.Queue()
        for _ in range(2):
            self._free.put(torch.empty(0, dtype=torch.uint8))
        # At most two steps wait for the disk: a slow disk slows training, memory stays bounded.
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=2)
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._work, name="ddp-verify-trace writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                job()
            except Exception as e:  # reported to the training thread by its next call
                self._error = e
            finally:
                self._jobs.task_done()

    def _check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"ddp_verify_trace: writing {self._part} failed: {self._error}") from self._error

    def later(self, job: Callable[[], None]) -> None:
        self._check()
        self._jobs.put(job)

    def busy(self) -> bool:
        return self._jobs.unfinished_tasks > 0

    def settle(self) -> None:
        self._jobs.join()
        self._check()

    def put(self, copied: Sequence[tuple[str, torch.Tensor]], lent: Iterable[tuple[str, torch.Tensor]] = ()) -> None:
        """One step's big tensors. `copied` are copied now (training goes on changing them);
        `lent` are written as they are, and training must not change them until `settle`
        (the recorder lends gradients that the loop sets to None after the step). Every
        tensor put has the trace's one float dtype, so offsets stay multiples of its size."""
        self._check()
        sizes = [t.numel() * t.element_size() for _, t in copied]
        total = sum(sizes)
        buf = None
        if total:
            buf = self._free.get()
            if buf.numel() < total:
                buf = torch.empty(total, dtype=torch.uint8)
        at = 0
        for (name, t), size in zip(copied, sizes):
            self._entry(name, t, at, size)
            at += size
        if total and all(t.is_cpu and t.dtype == copied[0][1].dtype for _, t in copied):
            # One copy of them all (they share one dtype): a copy each costs a small
            # model's step more in dispatch than in bytes.
            flat = [t.detach().reshape(-1) for _, t in copied]
            torch.cat(flat, out=buf[:total].view(flat[0].dtype))
        elif total:  # from a device: each into its place
            at = 0
            for (_, t), size in zip(copied, sizes):
                buf[at : at + size].view(t.dtype).view(t.shape).copy_(t.detach())
                at += size
        kept = []
        for name, t in lent:
            size = t.numel() * t.element_size()
            self._entry(name, t, at, size)
            at += size
            kept.append((name, t.detach(), t._version))
        self._written += at

        def write() -> None:
            try:
                if self._error is not None:  # the file is lost already; the buffer comes back
                    return
                if buf is not None:
                    # FileIO.write releases the GIL: training goes on while this thread writes.
                    self._file.write(_bytes(buf[:total]))
                for name, t, version in kept:
                    self._file.write(_bytes(t.reshape(-1)))
                    if t._version != version:
                        raise RuntimeError(f"{name} was changed in place before it was written")
            finally:
                if buf is not None:
                    self._free.put(buf)

        self._jobs.put(write)

    def _entry(self, name: str, t: torch.Tensor, at: int, size: int) -> None:
        start = self._written + at
        self._entries[name] = (t.dtype, tuple(t.shape), start, start + size)

    def keep(self, name: str, tensor: torch.Tensor) -> None:
        """A small tensor, which the caller owns and never changes (it is not copied)."""
        if tensor.is_cpu and not tensor.requires_grad and tensor.is_contiguous():
            self._small[name] = tensor  # the recorder's own: most of them, as they are
        else:
            self._small[name] = tensor.detach().cpu().contiguous()

    def _drain(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def close(self, metadata: dict[str, str]) -> None:
        self._drain()
        self._check()
        small = sorted(self._small.items(), key=lambda kv: (kv[1].element_size(), kv[0]))
        small_bytes = sum(t.numel() * t.element_size() for _, t in small)
        header = {"__metadata__": metadata}
        at = 0
        for name, t in small:
            size = t.numel() * t.element_size()
            header[name] = _entry(t.dtype, t.shape, at, at + size)
            at += size
        for name, (dtype, shape, start, end) in self._entries.items():
            header[name] = _entry(dtype, shape, small_bytes + start, small_bytes + end)
        text = json.dumps(header, separators=(",", ":")).encode()
        buffer_at = RESERVED - small_bytes
        if 8 + len(text) <= buffer_at:
            self._write_front(self._file, text, buffer_at, small)
            self._file.close()
        else:
            self._file.flush()
            self._rewrite(text, small_bytes, small)
        os.replace(self._part, self.path)

    @staticmethod
    def _write_front(f: IO[bytes], text: bytes, buffer_at: int, small: list[tuple[str, torch.Tensor]]) -> None:
        """The header, padded to end at `buffer_at`, then the small tensors."""
        f.seek(0)
        f.write(struct.pack("<Q", buffer_at - 8))
        f.write(text.ljust(buffer_at - 8, b" "))
        for _, t in small:
            f.write(_bytes(t))

    def _rewrite(self, text: bytes, small_bytes: int, small: list[tuple[str, torch.Tensor]]) -> None:
        """The header outgrew the room before the streamed bytes: one copy into a new file."""
        fresh = self._part + "2"
        # The streamed bytes must start 8-aligned: pad the header so that they do.
        data_at = 8 + len(text) + small_bytes
        data_at += -data_at % 8
        with open(fresh, "wb") as out:
            self._write_front(out, text, data_at - small_bytes, small)
            self._file.seek(RESERVED)
            while True:
                chunk = self._file.read(1 << 24)
                if not chunk:
                    break
                out.write(chunk)
        self._file.close()
        os.replace(fresh, self._part)

    def abandon(self) -> None:
        """No trace: the writer stops and the partial file goes."""
        self._drain()
        self._file.close()
        try:
            os.remove(self._part)
        except FileNotFoundError:
            pass


def _bytes(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, not copied, for a file's write (which releases the GIL).
    Read through ctypes, not Tensor.numpy(): torch does not require NumPy (torch 2.4's and
    2.5's wheels install without it), nor does the recorder. The caller keeps `t` unchanged
    until the write returns; the view keeps it alive (a reshape's copy is not freed under it)."""
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("ddp_verify_trace: a tensor to write is not contiguous in CPU memory")
    size = t.numel() * t.element_size()
    if size == 0:
        return memoryview(b"")
    raw = (ctypes.c_char * size).from_address(t.data_ptr())
    raw.tensor = t  # type: ignore[attr-defined]  # ctypes arrays take attributes: kept while the view lives
    return memoryview(raw)


def _entry(dtype: torch.dtype, shape: Sequence[int], start: int, end: int) -> dict[str, Any]:
    return {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [start, end]}
