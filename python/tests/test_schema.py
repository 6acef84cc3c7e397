"""What the recorder writes holds to the trace schema (`_schema.py`, generated from the Rust
tables `ddp-verify compare` reads by): every tensor's name, dtype and shape, every header key
and its value. A Rust test holds `_schema.py` to those tables."""
import os
import re

import torch
import torch.nn as nn
from safetensors import safe_open

import ddp_verify_trace
from _world import run_world
from ddp_verify_trace import _schema

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _kind_of(name):
    """The one schema kind whose pattern `name` matches, with its step and parameter."""
    found = []
    for kind, (pattern, _, _) in _schema.TENSORS.items():
        regex = re.escape(pattern).replace(r"\{step\}", r"(?P<step>\d+)").replace(r"\{param\}", r"(?P<param>.+)")
        if re.fullmatch(regex, name):
            found.append(kind)
    assert len(found) == 1, f"{name} matches {found} in the schema"
    return found[0]


def _value_ok(kind, allowed, value):
    if kind == "text":
        return True
    if kind == "count":
        return value.isdigit() and int(value) >= 1
    if kind == "number":
        return _finite(value)
    if kind == "numbers":
        return bool(value.split()) and all(_finite(v) for v in value.split())
    if kind == "flag":
        return value.lower() in ("true", "false")
    return value in allowed


def _finite(v):
    try:
        return abs(float(v)) != float("inf") and float(v) == float(v)
    except ValueError:
        return False


def check_trace(path):
    """Asserts every tensor and header key of the trace at `path` is one the schema defines,
    typed as it says; returns the tensors' kinds and the header."""
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    floats = {t.dtype for n, t in tensors.items() if _schema.TENSORS[_kind_of(n)][1] == "float"}
    assert len(floats) == 1 and floats <= set(_FLOATS), floats
    kinds = set()
    for name, t in tensors.items():
        kind = _kind_of(name)
        kinds.add(kind)
        _, elements, shape = _schema.TENSORS[kind]
        assert {"i64": t.dtype == torch.int64, "f64": t.dtype == torch.float64}.get(elements, True), (name, t.dtype)
        if elements == "finite":
            assert torch.isfinite(t.double()).all(), name
        assert {"one": t.numel() == 1, "two": t.numel() == 2, "some": t.numel() >= 1, "vector": t.dim() == 1}.get(
            shape, True
        ), (name, t.shape)
    assert meta["format"] == _schema.FORMAT
    for key, value in meta.items():
        assert key in _schema.HEADER, f"header key {key} is not in the schema"
        kind, allowed, _ = _schema.HEADER[key]
        assert _value_ok(kind, allowed, value), (key, value)
    missing = [k for k, (_, _, required) in _schema.HEADER.items() if required and k not in meta]
    assert not missing, missing
    return kinds, meta


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.out = nn.Linear(3, 1)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x)))).mean()


def _train(model, steps=3, acc=2, ddp=False):
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for i in range(acc):
            x = torch.randn(5, 4, generator=g)
            sync = not ddp or i == acc - 1
            with torch.enable_grad() if sync else model.no_sync():
                scaler.scale(model(x) / acc).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad()


def test_a_single_process_trace_holds_to_the_schema(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "acc.safetensors"
    with ddp_verify_trace.recording(path, acc_steps=2, steps_per_epoch=3):
        _train(Net())
    kinds, meta = check_trace(path)
    assert {"grads", "scale", "final", "peak", "buffer", "lr", "micro", "clips", "clip", "loss_scale"} <= kinds
    assert meta["optimizer"] == "AdamW" and meta["run"] == "single"


def _ddp_worker(rank, world, tmp):
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net())
    with ddp_verify_trace.recording(os.path.join(tmp, "ddp.safetensors"), acc_steps=2 * world):
        _train(model, ddp=True)


def test_a_ddp_trace_holds_to_the_schema(tmp_path):
    run_world(_ddp_worker, 2, str(tmp_path))
    kinds, meta = check_trace(tmp_path / "ddp.safetensors")
    assert {"rank_bits", "ddp_sync"} <= kinds
    assert meta["run"] == "ddp" and meta["world_size"] == "2" and meta["ddp_forward"] == "seen"


def test_the_recorder_names_tensors_by_the_schema():
    assert _schema.name("grads", 3, "fc.weight") == "grads.3.fc.weight"
    assert _schema.name("final", param="fc.weight") == "final.fc.weight"
    assert _schema.name("lr", 2) == "lr.2"


def test_optimizer_settings_are_written_as_numbers_or_left_out():
    from ddp_verify_trace.recorder import _setting

    assert _setting((0.9, 0.999)) == "0.9 0.999" and _setting(1e-08) == "1e-08" and _setting(False) == "False"
    assert _setting(torch.tensor(0.01)) == str(torch.tensor(0.01).item())
    # Adafactor's eps is (None, 1e-3), some optimizers keep strings: no number, no key.
    assert _setting((None, 1e-3)) is None and _setting("auto") is None and _setting(None) is None
    assert _setting(float("nan")) is None
