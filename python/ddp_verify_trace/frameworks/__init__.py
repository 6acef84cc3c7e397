"""The frameworks that call optimizer.step() for the user, behind one interface
(`base.Framework`): Transformers' Trainer, Lightning, Colossal-AI, Accelerate, DeepSpeed.

`FRAMEWORKS` is the registry, outermost first: Transformers' Trainer steps through
Accelerate, and the framework a header names is the user's, the outermost one calling.
Callbacks (`DDPVerifyCallback`, `DDPVerifyLightningCallback` and their deprecated aliases
`TrainerCallback`, `LightningCallback`) are built on first use (`callbacks.py`): this package
imports without any framework.

Adding a framework: a module here with a subclass of `base.Framework`, and its line below."""
from __future__ import annotations

from .. import _owners
from .._patches import Patches
from .accelerate import Accelerate
from .base import Framework, forget_plan, planned
from .colossalai import ColossalAi
from .deepspeed import DeepSpeed
from .lightning import Lightning
from .transformers import Transformers

FRAMEWORKS: list[Framework] = [Transformers(), Lightning(), ColossalAi(), Accelerate(), DeepSpeed()]
# Called by none of them.
PLAIN = _owners.PLAIN
# Which frames are whose (`_owners`): each framework's packages, in the registry's order.
for _fw in FRAMEWORKS:
    _owners.register(_fw.name, _fw.modules)


def patch(patches: Patches) -> None:
    """Every registered framework's patches of torch and of itself."""
    for fw in FRAMEWORKS:
        fw.patch(patches)


__all__ = ["FRAMEWORKS", "PLAIN", "Framework", "forget_plan", "patch", "planned"]

# The callbacks' names under `ddp_verify_trace` (built by `callbacks.py`).
CALLBACKS = tuple(n for fw in FRAMEWORKS for n in fw.callback_names)
