"""One-line callbacks for the frameworks that take callbacks. Each starts the same optimizer
step hooks as `record()` when training begins and writes the trace when it ends: the hook
fires once per real optimizer step, after accumulation, the all-reduce and clipping, the
same place in every framework (Trainer's on_pre_optimizer_step fires after clipping,
Lightning's on_before_optimizer_step before it, so neither is used).

Their arguments are `record()`'s, checked when the callback is made. `TrainerCallback` and
`LightningCallback` are deprecated aliases: the first is also the name of Transformers' own
base class."""
from __future__ import annotations

from typing import Any

from .hook import Session


def _session(path: Any, kwargs: dict[str, Any]) -> Session:
    from . import _header, _sample

    meta = _header(kwargs.pop("acc_steps", None), kwargs.pop("steps_per_epoch", None))
    # As record(): sample= not given takes DDP_VERIFY_SAMPLE, else "auto".
    sample = _sample(kwargs.pop("sample", None))
    return Session(path, meta=meta, sample=sample, **kwargs)


try:
    import transformers

    class DDPVerifyCallback(transformers.TrainerCallback):
        """`Trainer(..., callbacks=[DDPVerifyCallback("out/ddp.safetensors")])`."""

        def __init__(self, path: Any, **kwargs: Any) -> None:
            self._session = _session(path, kwargs)

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            self._session.start()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._session.close()

except ImportError:  # pragma: no cover - without transformers

    class DDPVerifyCallback:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("ddp_verify_trace.DDPVerifyCallback needs transformers (pip install transformers)")


try:
    try:
        from lightning.pytorch.callbacks import Callback as _LightningBase
    except ImportError:
        from pytorch_lightning.callbacks import Callback as _LightningBase  # type: ignore[no-redef,assignment]

    class DDPVerifyLightningCallback(_LightningBase):
        """`L.Trainer(..., callbacks=[DDPVerifyLightningCallback("out/ddp.safetensors")])`."""

        def __init__(self, path: Any, **kwargs: Any) -> None:
            self._session = _session(path, kwargs)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self._session.start()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self._session.close()

except ImportError:  # pragma: no cover - without lightning

    class DDPVerifyLightningCallback:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("ddp_verify_trace.DDPVerifyLightningCallback needs lightning (pip install lightning)")


# Deprecated aliases, the names of earlier versions.
TrainerCallback = DDPVerifyCallback
LightningCallback = DDPVerifyLightningCallback
