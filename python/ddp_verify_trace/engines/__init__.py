"""The engines that synchronise a run's gradients, behind one interface (`base.Engine`).

`ENGINES` is the registry, asked in order: the first whose `find` claims the run is its
engine, `Ddp` (one process, or DDP) last, claiming whatever is left. Each engine's torch
patches go in with the first recording and come out with the last (`_patches`).

Adding an engine: a module here with a subclass of `base.Engine`, and its line below."""
from __future__ import annotations

import torch

from .._patches import Patches
from .base import Engine
from .ddp import Ddp
from .deepspeed import DeepSpeed
from .fsdp2 import Fsdp2

ENGINES: list[type[Engine]] = [
    DeepSpeed,  # its inner optimizer steps flat partitions: known by the optimizer
    Fsdp2,  # DTensor parameters
    Ddp,  # the rest: whole parameters on every rank
]

__all__ = ["ENGINES", "Engine", "find", "patch", "setting_up"]


def find(optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor]) -> Engine:
    """The engine that trains `params` (stepped by `optimizer`, where known)."""
    for kind in ENGINES:
        engine = kind.find(optimizer, params)
        if engine is not None:
            return engine
    raise RuntimeError("ddp_verify_trace: no engine claims the run (the registry must end with Ddp)")


def setting_up(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` steps inside an engine's own setup (DeepSpeed's FP16 wrappers step
    their optimizer once, on zero gradients, while deepspeed.initialize builds them): no
    training step, and no step to find the model by."""
    return any(kind.setting_up(optimizer) for kind in ENGINES)


def patch(patches: Patches) -> None:
    """Every registered engine's patches of torch."""
    for kind in ENGINES:
        kind.patch(patches)
