"""The frameworks that call optimizer.step() for the user, behind one interface
(`base.Framework`): Transformers' Trainer, Lightning, Colossal-AI, Accelerate, DeepSpeed.

`FRAMEWORKS` is the registry, outermost first: Transformers' Trainer steps through
Accelerate, and the framework a header names is the user's, the outermost one calling.
Callbacks (`DDPVerifyCallback`, `DDPVerifyLightningCallback` and their deprecated aliases
`TrainerCallback`, `LightningCallback`) are built on first use: this package imports without
any framework.

Adding a framework: a module here with a subclass of `base.Framework`, and its line below."""
from __future__ import annotations

from typing import Any

from .. import _owners
from .._patches import Patches
from .accelerate import Accelerate
from .base import Framework
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

_BUILT: dict[str, type] = {}


def patch(patches: Patches) -> None:
    """Every registered framework's patches of torch and of itself."""
    for fw in FRAMEWORKS:
        fw.patch(patches)


def _session(path: Any, kwargs: dict[str, Any]) -> Any:
    """record()'s session for a callback: its arguments checked now, the recording started
    when training begins."""
    from .. import _header, _sample
    from ..hook import Session

    meta = _header(kwargs.pop("acc_steps", None), kwargs.pop("steps_per_epoch", None))
    # As record(): sample= not given takes DDP_VERIFY_SAMPLE, else "auto".
    sample = _sample(kwargs.pop("sample", None))
    return Session(path, meta=meta, sample=sample, **kwargs)


def _missing(fw: Framework, name: str) -> type:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ImportError(f"ddp_verify_trace.{name} needs {fw.modules[0]} (pip install {fw.modules[0]})")

    return type(name, (), {"__init__": refuse})


def __getattr__(name: str) -> Any:
    for fw in FRAMEWORKS:
        if name in fw.callback_names:
            own = fw.callback_names[0]
            if own not in _BUILT:
                built = fw.callback(_session) or _missing(fw, own)
                built.__module__, built.__qualname__ = __name__, own
                _BUILT[own] = built
            return _BUILT[own]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CALLBACKS = tuple(n for fw in FRAMEWORKS for n in fw.callback_names)
