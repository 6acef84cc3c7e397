"""The recorder's collectives, which have their tensors back before they return.

Gloo's worker thread lets go of a collective's tensors just after the caller's wait has
returned, and letting go of a tensor that Python also holds takes the GIL. After the
script's last collective (the trace's, at destroy_process_group or at exit) the process
may be finalizing by then, where a process group outlives destroy_process_group (an
engine's modules hold it): the worker cannot take the GIL, is unwound through a destructor, and the
rank dies of SIGABRT ("terminate called without an active exception") after a training
that went well. So each call here waits, the GIL released, until the worker has let go.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

# How long to wait for a worker to let go: a backend that keeps its tensors longer is never
# waited for again (its late release is not gloo's).
_PATIENCE_S = 0.2
_patient = True


def all_reduce(t: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None) -> None:
    held = _counts([t])
    dist.all_reduce(t, op=op, group=group)
    _let_go(held, group)


def all_gather(out: list[torch.Tensor], t: torch.Tensor, group: Any = None) -> None:
    held = _counts([*out, t])
    dist.all_gather(out, t, group=group)
    _let_go(held, group)


def _counts(tensors: list[torch.Tensor]) -> list[tuple[torch.Tensor, int]]:
    return [(t, t._use_count()) for t in tensors]


def _let_go(held: list[tuple[torch.Tensor, int]], group: Any) -> None:
    global _patient
    if not _patient or dist.get_backend(group) != "gloo":
        return
    deadline = time.monotonic() + _PATIENCE_S
    for t, count in held:
        while t._use_count() > count:
            if time.monotonic() > deadline:
                _patient = False
                return
            time.sleep(5e-5)  # the GIL released: the worker takes it
