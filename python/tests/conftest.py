"""`torch_as_found`: every place the recorder patches (read from its registry, `_patches`),
sys.excepthook, and a spy on the exit handlers it registers, taken when a test starts;
`check()` holds them as they were."""
import atexit
import sys

import pytest

from ddp_verify_trace import _patches, _watch


def label(owner, name):
    """`module.Class.name` of a patched place, for messages."""
    where = getattr(owner, "__qualname__", None)
    where = f"{owner.__module__}.{where}" if where and hasattr(owner, "__module__") else owner.__name__
    return f"{where}.{name}"


class Untouched:
    """Takes the patched places now, and spies on atexit from now; `check()` holds every place
    the registry ever patched to what it was (a place first patched during the test, to what
    the registry found there), sys.excepthook unchanged, and no exit handler, open watch,
    patch or import finder of the recorder's left."""

    def __init__(self, monkeypatch):
        self.before = {(id(o), n): getattr(o, n) for o, n, _ in _patches.places()}
        self.excepthook = sys.excepthook
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
        """The places (every one the registry knows) not holding what they held."""
        return [
            label(o, n)
            for o, n, found in _patches.places()
            if getattr(o, n) is not self.before.get((id(o), n), found)
        ]

    def check(self):
        assert self.changed() == []
        assert sys.excepthook is self.excepthook
        assert self.exit_handlers == []
        assert _watch.OPEN == []
        assert [label(p.owner, p.name) for p in _patches.made()] == []
        assert _patches.waiting() == []


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
