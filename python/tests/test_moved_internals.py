"""A torch internal the recorder patches that a release moved or renamed: that part is not
recorded, the trace's header says so, and training goes on, its weights those of a run
without the recorder."""
import torch
import torch.nn as nn
from safetensors import safe_open

from ddp_verify_trace import TraceRecorder, _patches


def train(path=None):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = TraceRecorder(model, path, optimizer=opt, acc_steps=2) if path else None
    for _ in range(2):
        for _ in range(2):
            (model(torch.randn(3, 4)).sum() / 2).backward()
        if rec:
            rec.step()
        opt.step()
        opt.zero_grad()
    if rec:
        rec.close()
    return [p.detach().clone() for p in model.parameters()]


def test_a_moved_internal_is_a_warning_and_training_goes_on(tmp_path, monkeypatch):
    from torch.amp import GradScaler

    monkeypatch.delattr(GradScaler, "step")  # as a release that renamed it would have it
    path = tmp_path / "t.safetensors"
    recorded = train(path)
    assert all(torch.equal(a, b) for a, b in zip(recorded, train()))
    with safe_open(str(path), "pt") as f:
        warnings = f.metadata()["warnings"].splitlines()
    assert any(w.startswith("GradScaler.step") and f"torch {torch.__version__}" in w and "not recorded" in w
               for w in warnings), warnings
    assert not hasattr(GradScaler, "step")  # nothing put where there was nothing


def test_a_patch_that_fails_on_import_is_said_and_the_import_goes_on():
    def broken(module):
        raise AttributeError("module has no attribute '_post_forward'")

    _patches.after_import("json", broken)  # imported already: at once
    assert any(w.startswith("a patch of json failed (torch ") and "_post_forward" in w for w in _patches.missing())
