"""Transformers' Trainer: it steps through Accelerate (the outermost framework is the user's),
and takes `DDPVerifyCallback`, which starts the same optimizer step hooks as `record()` when
training begins and writes the trace when it ends: they fire once per real optimizer step,
after accumulation, the all-reduce and clipping (the callback's own on_pre_optimizer_step
would fire after clipping too, but Lightning has no such hook, so neither is used). Its
arguments are `record()`'s, checked when the callback is made."""
from __future__ import annotations

from typing import Any

from .. import _schema
from .base import Framework, SessionMaker


class Transformers(Framework):
    name = _schema.Framework.TRANSFORMERS
    modules = ("transformers",)
    callback_names = ("DDPVerifyCallback", "TrainerCallback")

    def callback(self, session: SessionMaker) -> type | None:
        try:
            import transformers
        except ImportError:
            return None

        class DDPVerifyCallback(transformers.TrainerCallback):
            """`Trainer(..., callbacks=[DDPVerifyCallback("out/ddp.safetensors")])`."""

            def __init__(self, path: Any, **kwargs: Any) -> None:
                self._session = session(path, kwargs)

            def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
                self._session.start()

            def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                self._session.close()

        return DDPVerifyCallback
