"""Accelerate: `accelerator.backward` divides the loss under `accumulate()`, and its wrapped
optimizer skips the steps inside an accumulation window; recorded by `record()` or with no
edit, named in the header when it calls optimizer.step()."""
from __future__ import annotations

from .. import _schema
from .base import Framework


class Accelerate(Framework):
    name = _schema.Framework.ACCELERATE
    modules = ("accelerate",)
