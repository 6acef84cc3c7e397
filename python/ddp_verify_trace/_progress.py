"""Rank 0's optimizer steps so far, for ddp-verify's progress line while a leg runs.

`ddp-verify -- python train.py` names the file in DDP_VERIFY_PROGRESS and reads it a few
times a second. The count is a few bytes rewritten in place, at most four times a second
(and at close), so a step pays a clock read. Nothing here raises: a file that cannot be
written turns the count off, and training goes on.
"""
from __future__ import annotations

import os
import time

ENV = "DDP_VERIFY_PROGRESS"
_EVERY_S = 0.25
_fd: int | None = None
_last = 0.0
_off = False


def tick(steps: int, force: bool = False) -> None:
    global _fd, _last, _off
    if _off:
        return
    now = time.monotonic()
    if not force and now - _last < _EVERY_S:
        return
    _last = now
    try:
        if _fd is None:
            path = os.environ.get(ENV)
            if not path:
                _off = True
                return
            _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(_fd, b"%20d\n" % steps, 0)
    except OSError:
        _off = True
