"""The callbacks a framework takes instead of `record()`: `DDPVerifyCallback` (Transformers'
Trainer), `DDPVerifyLightningCallback` (Lightning) and their deprecated aliases
`TrainerCallback` and `LightningCallback`. Each subclasses its framework's own class, so each
framework builds its own (`Framework.callback`); here they are built on first use, given the
`Session` they start when training begins and close when it ends, so that the package imports
without any framework."""
from __future__ import annotations

from typing import Any

from ._args import header_meta, resolve_sample
from .frameworks import FRAMEWORKS
from .frameworks.base import Framework
from .session import Session

_BUILT: dict[str, type] = {}


def _session(path: Any, kwargs: dict[str, Any]) -> Session:
    """record()'s session for a callback: its arguments checked now, the recording started
    when training begins."""
    meta = header_meta(kwargs.pop("acc_steps", None), kwargs.pop("steps_per_epoch", None))
    # As record(): sample= not given takes DDP_VERIFY_SAMPLE, else "auto".
    sample = resolve_sample(kwargs.pop("sample", None))
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
