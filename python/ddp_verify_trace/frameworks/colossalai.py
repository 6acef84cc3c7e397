"""Colossal-AI's booster: its plugins wrap the optimizer (the DDP plugin's `no_sync`, seed
004); recorded by `record()` or with no edit, named in the header when it calls
optimizer.step()."""
from __future__ import annotations

from .. import _schema
from .base import Framework


class ColossalAi(Framework):
    name = _schema.Framework.COLOSSALAI
    modules = ("colossalai",)
