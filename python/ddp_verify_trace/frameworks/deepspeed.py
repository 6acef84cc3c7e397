"""DeepSpeed's engine as the loop: `engine.backward` divides the loss by its
gradient_accumulation_steps and `engine.step` steps at the window's boundary (the engine
that synchronises is `engines/deepspeed.py`); named in the header when it calls
optimizer.step()."""
from __future__ import annotations

from .. import _schema
from .base import Framework


class DeepSpeed(Framework):
    name = _schema.Framework.DEEPSPEED
    modules = ("deepspeed",)
    backward_apis = (("deepspeed.runtime.engine", "DeepSpeedEngine", "backward"),)
    boundary_setters = (("deepspeed.runtime.engine", "DeepSpeedEngine", "set_gradient_accumulation_boundary"),)
    step_wrappers = (
        ("deepspeed.runtime.engine", "DeepSpeedEngine", "step", lambda e: e.gradient_accumulation_steps()),
    )
