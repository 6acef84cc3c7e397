"""Transformers' Trainer: it steps through Accelerate (the outermost framework is the user's),
and takes `DDPVerifyCallback`, which starts the same optimizer step hooks as `record()` when
training begins and writes the trace when it ends: they fire once per real optimizer step,
after accumulation, the all-reduce and clipping (the callback's own on_pre_optimizer_step
would fire after clipping too, but Lightning has no such hook, so neither is used). Its
arguments are `record()`'s, checked when the callback is made."""
from __future__ import annotations

from typing import Any

from .. import _schema
from . import base
from .base import Framework, SessionMaker


def _plan(handler: Any, args: Any, state: Any, *rest: Any, **kwargs: Any) -> dict[str, str]:
    """Trainer's plan as training begins, as header facts: its max_steps, computed from the
    loader's length and the epochs where the script set no max_steps (then the steps are the
    script's); and whose tokens num_items_in_batch counts (average_tokens_across_devices,
    resolved by now: off where the world cannot gather)."""
    K = _schema.Key
    facts: dict[str, str] = {}
    across = getattr(args, "average_tokens_across_devices", None)
    if isinstance(across, bool):
        facts[K.NORMALISER_SCOPE] = "world" if across else "rank"
        field = getattr(type(args), "__dataclass_fields__", {}).get("average_tokens_across_devices")
        default = getattr(field, "default", None)
        facts[K.NORMALISER_SCOPE_BY] = _schema.Framework.TRANSFORMERS if across == default else _schema.Framework.PLAIN
    if getattr(args, "max_steps", 0) > 0:
        return facts
    loader = getattr(handler, "train_dataloader", None)
    return {**facts, **base.plan(state.max_steps, len(loader), args.gradient_accumulation_steps, args.num_train_epochs)}


class Transformers(Framework):
    name = _schema.Framework.TRANSFORMERS
    modules = ("transformers",)
    callback_names = ("DDPVerifyCallback", "TrainerCallback")
    # Trainer hands its callbacks the plan it made (steps from the loader) before the first step.
    planners = (("transformers.trainer_callback", "CallbackHandler", "on_train_begin", _plan),)

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
