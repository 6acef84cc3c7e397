"""Accelerate: `accelerator.backward` divides the loss under `accumulate()`, and its wrapped
optimizer skips the steps inside an accumulation window; recorded by `record()` or with no
edit, named in the header when it calls optimizer.step()."""
from __future__ import annotations

from .. import _schema
from .base import Framework


class Accelerate(Framework):
    name = _schema.Framework.ACCELERATE
    modules = ("accelerate",)
    backward_apis = (("accelerate.accelerator", "Accelerator", "backward"),)
    step_wrappers = (
        ("accelerate.optimizer", "AcceleratedOptimizer", "step", lambda o: o.gradient_state.num_steps),
    )
