"""`torch_as_found`: the globals a recording patches, taken when a test starts, and a spy on
the exit handlers it registers; `check()` holds them as they were."""
import atexit
import sys

import pytest
import torch
import torch.nn.utils.clip_grad
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from ddp_verify_trace import _watch


def places():
    """Every global a recording patches, with the torch version's own objects there now."""
    spots = [
        (torch.nn.utils, "clip_grad_norm_"),
        (torch.nn.utils.clip_grad, "clip_grad_norm_"),
        (DistributedSampler, "set_epoch"),
        (torch.amp.GradScaler, "step"),
        (torch.optim.Optimizer, "__init__"),
        (sys, "excepthook"),
    ]
    if hasattr(torch.cuda.amp, "GradScaler"):
        spots.append((torch.cuda.amp.GradScaler, "step"))
    if hasattr(DistributedDataParallel, "_post_forward"):
        spots.append((DistributedDataParallel, "_post_forward"))
    return {f"{getattr(o, '__name__', o)}.{n}": (o, n, getattr(o, n)) for o, n in spots}


class Untouched:
    """Takes the globals now, and spies on atexit from now; `check()` holds the globals
    unchanged and no exit handler of the recorder's registered."""

    def __init__(self, monkeypatch):
        self.before = places()
        self.exit_handlers = []
        register, unregister = atexit.register, atexit.unregister

        def spy_register(func, *args, **kwargs):
            if getattr(func, "__module__", "").startswith("ddp_verify_trace"):
                self.exit_handlers.append(func)
            return register(func, *args, **kwargs)

        def spy_unregister(func):
            self.exit_handlers[:] = [f for f in self.exit_handlers if f != func]
            return unregister(func)

        monkeypatch.setattr(atexit, "register", spy_register)
        monkeypatch.setattr(atexit, "unregister", spy_unregister)

    def changed(self):
        return [k for k, (o, n, obj) in self.before.items() if getattr(o, n) is not obj]

    def check(self):
        assert self.changed() == []
        assert self.exit_handlers == []
        assert _watch.OPEN == []


@pytest.fixture
def torch_as_found(monkeypatch):
    return Untouched(monkeypatch)


@pytest.fixture(scope="session")
def deepspeed_runs(tmp_path_factory):
    """DeepSpeed ZeRO's runs and recordings at W=1 and W=2 (`_deepspeed_runs`), made once for
    every test that reads them; skipped, saying so, where deepspeed is not installed."""
    pytest.importorskip("deepspeed")
    import _deepspeed_runs

    return _deepspeed_runs.run_all(tmp_path_factory.mktemp("deepspeed"))
