"""One-line callbacks for the frameworks that take callbacks. Each starts the same optimizer
step hooks as `record()` when training begins and writes the trace when it ends: the hook
fires once per real optimizer step, after accumulation, the all-reduce and clipping, the
same place in every framework (Trainer's on_pre_optimizer_step fires after clipping,
Lightning's on_before_optimizer_step before it, so neither is used)."""
from .hook import Session


def _session(path, kwargs):
    from . import _header

    meta = _header(kwargs.pop("acc_steps", None), kwargs.pop("steps_per_epoch", None))
    return Session(path, meta=meta, **kwargs)


try:
    import transformers

    class TrainerCallback(transformers.TrainerCallback):
        """`Trainer(..., callbacks=[TrainerCallback("out/ddp.safetensors")])`."""

        def __init__(self, path, **kwargs):
            self._session = _session(path, kwargs)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._session.start()

        def on_train_end(self, args, state, control, **kwargs):
            self._session.close()

except ImportError:  # pragma: no cover - without transformers

    class TrainerCallback:
        def __init__(self, *args, **kwargs):
            raise ImportError("ddp_verify_trace.TrainerCallback needs transformers (pip install transformers)")


try:
    try:
        from lightning.pytorch.callbacks import Callback as _LightningBase
    except ImportError:
        from pytorch_lightning.callbacks import Callback as _LightningBase

    class LightningCallback(_LightningBase):
        """`L.Trainer(..., callbacks=[LightningCallback("out/ddp.safetensors")])`."""

        def __init__(self, path, **kwargs):
            self._session = _session(path, kwargs)

        def on_train_start(self, trainer, pl_module):
            self._session.start()

        def on_train_end(self, trainer, pl_module):
            self._session.close()

except ImportError:  # pragma: no cover - without lightning

    class LightningCallback:
        def __init__(self, *args, **kwargs):
            raise ImportError("ddp_verify_trace.LightningCallback needs lightning (pip install lightning)")
