"""The recorder's collectives, whose tensors are all given back before the trace is closed.

Gloo's worker thread lets go of a collective's tensors just after the caller's wait has
returned, and letting go of a tensor that Python also holds takes the GIL. After the
recorder's last collective (the trace's, at destroy_process_group or at exit) the process
may be finalizing by then, where a process group outlives destroy_process_group (an
engine's modules hold it): the worker cannot take the GIL, is unwound through a destructor,
and the rank dies of SIGABRT ("terminate called without an active exception") after a
training that went well. So the tensors still held are noted (weakly: nothing is kept
alive), and `settle`, as a recorder closes, waits with the GIL released until the worker has
let go of them. Steps do not wait: training goes on, and the worker takes the GIL meanwhile.
"""
from __future__ import annotations

import time
import weakref
from typing import Any

import torch
import torch.distributed as dist

# How long `settle` waits for a worker to let go (a backend that keeps its tensors longer
# is not gloo's worker, and no reason to hold up the close).
_PATIENCE_S = 0.2
# (the tensor, weakly; its use count before the collective)
_held: list[tuple[weakref.ref[torch.Tensor], int]] = []


def all_reduce(t: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None) -> None:
    before = _note([t])
    dist.all_reduce(t, op=op, group=group)
    _held.extend(before)


def all_gather(out: list[torch.Tensor], t: torch.Tensor, group: Any = None) -> None:
    before = _note([*out, t])
    dist.all_gather(out, t, group=group)
    _held.extend(before)


def _note(tensors: list[torch.Tensor]) -> list[tuple[weakref.ref[torch.Tensor], int]]:
    """Never raises: a torch without `Tensor._use_count` is not waited for (the collective
    itself goes on as it would)."""
    try:
        _held[:] = [h for h in _held if _still_held(h)]
        return [(weakref.ref(t), t._use_count()) for t in tensors]
    except Exception:  # noqa: BLE001 - nothing noted; the close does not wait
        return []


def _still_held(h: tuple[weakref.ref[torch.Tensor], int]) -> bool:
    t = h[0]()
    return t is not None and t._use_count() > h[1]


def settle() -> None:
    """Waits, the GIL released, until no collective's worker holds a recorder's tensor."""
    deadline = time.monotonic() + _PATIENCE_S
    while _held:
        _held[:] = [h for h in _held if _still_held(h)]
        if not _held or time.monotonic() > deadline:
            break
        time.sleep(5e-5)  # the GIL released: the worker takes it
    _held.clear()
