"""`ddp-verify watch --stop-on-fault`: after each optimizer step `s` rank 0 writes a small trace
into the folder DDP_VERIFY_STEP_FILE (`step-<s>.safetensors`): the run's steps s - 1 and s as a
trace of their own
(`first_step` says which), with the header as close would write it, the step's small tensors
(stage facts, checksums, counts) and each parameter's applied gradient as its sum (one
element). ddp-verify judges each stage's
contract from each file in turn while the run goes on (removing those judged), and stops every
rank at the first broken step. Off unless the variable is set; written whole and renamed into
place, so never read half-written;
what cannot be written is a warning, and training goes on."""
from __future__ import annotations

import os
from typing import Any

import torch

from . import _schema
from ._stream import Stream


def wanted() -> str | None:
    return os.environ.get(_schema.STEP_FILE_ENV) or None


def flush(rec: Any, s: int, grads: dict[str, Any]) -> None:
    """Steps `s - 1` and `s` of recorder `rec` (rank 0) as a trace of two steps, 0 and 1
    (`first_step`: s - 1), so that the file costs the same at every step: the weights as step
    `s` found them show whether step `s - 1`'s update parted the ranks. A failure stops the
    flushing."""
    path = wanted()
    if path is None or getattr(rec, "_step_file_failed", False):
        return
    try:
        kept = getattr(rec._stream, "_small", {}) if rec._stream is not None else {}
        mine: dict[str, torch.Tensor] = {}
        for name, t in {**kept, **rec._tensors}.items():
            parts = name.split(".", 2)
            if len(parts) > 1 and parts[1] == str(s) and isinstance(t, torch.Tensor):
                mine[".".join([parts[0], "1", *parts[2:]])] = t
        for n, _ in rec._params:
            g = grads.get(n)
            if isinstance(g, torch.Tensor) and g.numel():
                mine[_schema.name("grads", 1, n)] = g.detach().double().sum().reshape(1).cpu().float()
        previous: dict[str, torch.Tensor] = getattr(rec, "_step_previous", {})
        rec._step_previous = {k.replace(".1", ".0", 1): v for k, v in mine.items()}
        steps = {**previous, **mine} if previous else {k.replace(".1", ".0", 1): v for k, v in mine.items()}
        # The weights are not judged here: a one-element placeholder each, as a trace holds finals.
        finals = {_schema.name("final", param=n): torch.zeros(1) for n, _ in rec._params}
        header = rec._header()
        header[_schema.Key.STEPS] = "2" if previous else "1"
        first = s - 1 if previous else s
        if first > 0:  # absent: the run's first step
            header[_schema.Key.FIRST_STEP] = str(first)
        os.makedirs(path, exist_ok=True)
        out = Stream(os.path.join(path, f".step-{s:09d}.safetensors"))
        for name, t in {**steps, **finals}.items():
            out.keep(name, t)
        out.close(header)
        # Renamed into place whole: the watcher reads only named ones, in order.
        os.replace(out.path, os.path.join(path, f"step-{s:09d}.safetensors"))
    except Exception as e:  # noqa: BLE001 - the recorder never breaks the run
        rec._step_file_failed = True
        rec._warn(f"the steps for watch --stop-on-fault could not be written ({e}); judged at the end instead")
