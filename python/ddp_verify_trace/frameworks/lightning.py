"""Lightning's Trainer: it passes the optimizer a closure that runs the last micro-batch's
backward and the clipping inside optimizer.step() (the step's post-hook sees them done), and
takes `DDPVerifyLightningCallback`: it starts and ends the recording only, as the step hooks
record after clipping (its on_before_optimizer_step fires before it)."""
from __future__ import annotations

from typing import Any

from .. import _schema
from .base import Framework, SessionMaker


class Lightning(Framework):
    name = _schema.Framework.LIGHTNING
    modules = ("lightning", "pytorch_lightning")
    callback_names = ("DDPVerifyLightningCallback", "LightningCallback")

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
