"""Lightning's Trainer: it passes the optimizer a closure that runs the last micro-batch's
backward and the clipping inside optimizer.step() (the step's post-hook sees them done), and
takes `DDPVerifyLightningCallback`: it starts and ends the recording only, as the step hooks
record after clipping (its on_before_optimizer_step fires before it).

Under manual optimization with its DDP strategy, `training_step` (backwards, steps and all)
runs inside DDP's forward, which Lightning ends with require_backward_grad_sync cleared: each
`manual_backward` decides for itself, where Lightning prepares DDP's reducer
(`prepare_for_backward`, with the flag `toggle_model(sync_grad=...)` or no_sync set). That
is where each micro-batch's flag is taken here, before the step it belongs to; the forward's
end is then no micro-batch (`engines.ddp.decided_inside`)."""
from __future__ import annotations

from typing import Any

import torch

from .. import _schema
from .._patches import Patches
from .base import Framework, SessionMaker


class Lightning(Framework):
    name = _schema.Framework.LIGHTNING
    modules = ("lightning", "pytorch_lightning")
    callback_names = ("DDPVerifyLightningCallback", "LightningCallback")
    # manual_backward (the script's, under manual optimization) outranks the strategy's
    # backward it calls; automatic optimization hands the loss divided by
    # accumulate_grad_batches straight to the strategy.
    backward_apis = (
        ("lightning.pytorch.core.module", "LightningModule", "manual_backward"),
        ("lightning.pytorch.strategies.strategy", "Strategy", "backward"),
    )
    step_wrappers = (
        (
            "lightning.pytorch.core.optimizer",
            "LightningOptimizer",
            "step",
            lambda o: o._strategy.lightning_module.trainer.accumulate_grad_batches,
        ),
    )

    def patch(self, patches: Patches) -> None:
        super().patch(patches)
        for package in ("lightning.pytorch", "pytorch_lightning"):
            patches.after_import(f"{package}.strategies.ddp", lambda module: _manual_ddp(patches, module))

    def callback(self, session: SessionMaker) -> type | None:
        try:
            from lightning.pytorch.callbacks import Callback as Base
        except ImportError:
            try:
                from pytorch_lightning.callbacks import Callback as Base  # type: ignore[no-redef,assignment]
            except ImportError:
                return None

        class DDPVerifyLightningCallback(Base):  # type: ignore[misc,valid-type]
            """`L.Trainer(..., callbacks=[DDPVerifyLightningCallback("out/ddp.safetensors")])`."""

            def __init__(self, path: Any, **kwargs: Any) -> None:
                self._session = session(path, kwargs)

            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                self._session.start()

            def on_train_end(self, trainer: Any, pl_module: Any) -> None:
                self._session.close()

        return DDPVerifyLightningCallback


def _manual_ddp(patches: Patches, module: Any) -> None:
    """Lightning's DDP strategy module: each backward's flag where manual optimization
    prepares DDP's reducer, and the forwards that ran them marked as decided inside."""
    from torch.nn.parallel import DistributedDataParallel

    from ..engines import ddp as engine

    prepare = getattr(module, "prepare_for_backward", None)
    redirection = getattr(module, "_DDPForwardRedirection", None)
    after_inner = getattr(redirection, "on_after_inner_forward", None)
    if prepare is None or after_inner is None:  # a Lightning that decides elsewhere: DDP's forward says
        return

    def prepare_for_backward(model: Any, output: Any) -> None:
        if isinstance(model, DistributedDataParallel):
            watches = patches.watches()
            engine.prepared(watches, model, bool(torch.is_grad_enabled() and model.require_backward_grad_sync))
        return prepare(model, output)

    def on_after_inner_forward(self: Any, wrapper_module: Any, original_module: Any) -> None:
        after_inner(self, wrapper_module, original_module)
        manual = not getattr(original_module, "automatic_optimization", True)
        if manual and isinstance(wrapper_module, DistributedDataParallel) and patches.watches():
            engine.decided_inside(wrapper_module)

    patches.replace(module, "prepare_for_backward", prepare_for_backward)
    patches.replace(redirection, "on_after_inner_forward", on_after_inner_forward)
