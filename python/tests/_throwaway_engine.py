"""A throwaway engine: all it takes to add one is this module and one line in the registry
(`engines.ENGINES`). It claims the parameters tagged `throwaway`, "reduces" each micro-batch's
gradient as a pretend world of two would average it (each backward noted through its own
patch of torch.autograd.backward, installed and undone by the recording), and hands the
recorder halved gradients, so a trace holding them proves the core asked it."""
from __future__ import annotations

from typing import Any

import torch

from ddp_verify_trace import _schema
from ddp_verify_trace._patches import Patches
from ddp_verify_trace.engines.base import Engine, Named

NAME = "throwaway"


class Throwaway(Engine):
    name = NAME
    backward_hooks = False
    no_magnitudes = "throwaway: no per-micro-batch magnitudes"

    @classmethod
    def find(cls, optimizer: torch.optim.Optimizer | None, params: list[torch.Tensor]) -> Engine | None:
        return cls() if any(getattr(p, "throwaway", False) for p in params) else None

    @staticmethod
    def patch(patches: Patches) -> None:
        backward = torch.autograd.backward

        def counted(*args: Any, **kwargs: Any) -> Any:
            for watch in patches.watches():
                watch.reduced(True)
                watch.synced(NAME, 1, 8)
            return backward(*args, **kwargs)

        patches.replace(torch.autograd, "backward", counted)

    def start(self, params: Named, sampling: Any) -> dict[str, str]:
        return {_schema.Key.ENGINE: NAME, _schema.Key.ENGINE_ACCUMULATION: "2"}

    def backwards(self, counts: dict[str, int], reduced: list[bool]) -> int:
        return len(reduced)

    def gradients(self, params: Named, sampling: Any, summaries: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return {n: None if p.grad is None else p.grad / 2 for n, p in params}, {}
