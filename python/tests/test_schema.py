"""What the recorder writes holds to the trace schema (`_schema.py`, generated from the Rust
tables `ddp-verify compare` reads by): every tensor's name, dtype and shape, every header key
and its value. A Rust test holds `_schema.py` to those tables."""
import json
import os
import re
import struct

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


class _Masked(nn.Module):
    """Buffers of every kind a model registers: a bool causal mask (GPT-2's in current
    Transformers), integers, and dtypes no trace holds (complex, uint16, float8)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)  # the model, not one layer, holds every parameter
        self.register_buffer("mask", torch.ones(4, 4, dtype=torch.bool).tril())
        self.register_buffer("count", torch.tensor([3], dtype=torch.int32))
        self.register_buffer("ids", torch.arange(4))
        self.register_buffer("flags", torch.tensor([1, 0, 2], dtype=torch.uint8))
        self.register_buffer("phase", torch.ones(2, dtype=torch.complex64))
        self.register_buffer("codes", torch.ones(2, dtype=torch.uint16))
        self.register_buffer("scales", torch.ones(2).to(torch.float8_e4m3fn))

    def forward(self, x):
        return self.out(self.fc(x).masked_fill(~self.mask, 0.0)).sum()


def test_buffers_of_any_dtype_are_recorded_or_left_out_saying_so(tmp_path):
    """A bool buffer is written as safetensors BOOL and integer ones as they are (ddp-verify
    reads them all); a buffer of a dtype no trace holds is left out with a header warning,
    and the recording goes on to write a trace that holds to the schema."""
    torch.manual_seed(0)
    model = _Masked()
    path = tmp_path / "masked.safetensors"
    with ddp_verify_trace.recording(path):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(4, 4)).backward()
            opt.step()
            opt.zero_grad()
    kinds, meta = check_trace(path)
    assert {"grads", "final", "buffer"} <= kinds and meta["steps"] == "2"
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    assert header["buffer.mask"]["dtype"] == "BOOL" and header["buffer.count"]["dtype"] == "I32"
    with safe_open(str(path), "pt") as f:
        for n in ("mask", "count", "ids", "flags"):
            assert torch.equal(f.get_tensor(f"buffer.{n}"), getattr(model, n)), n
        assert not {"buffer.phase", "buffer.codes", "buffer.scales"} & set(f.keys())
    lines = meta["warnings"].splitlines()
    for n, dtype in (("phase", "torch.complex64"), ("codes", "torch.uint16"), ("scales", "torch.float8_e4m3fn")):
        assert f"buffer {n}: its dtype {dtype} is not one a trace holds; not recorded" in lines


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
    from ddp_verify_trace._detect import setting as _setting

    assert _setting((0.9, 0.999)) == "0.9 0.999" and _setting(1e-08) == "1e-08" and _setting(False) == "False"
    assert _setting(torch.tensor(0.01)) == str(torch.tensor(0.01).item())
    # Adafactor's eps is (None, 1e-3), some optimizers keep strings: no number, no key.
    assert _setting((None, 1e-3)) is None and _setting("auto") is None and _setting(None) is None
    assert _setting(float("nan")) is None


K = 4  # micro-batches per optimizer step over all ranks


def _fsdp2_data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2 * K, 4, generator=g)  # micro-batch j: rows 2j, 2j+1


def _fsdp2_reference(steps=2):
    """One process, K micro-batches, each loss divided by K, AdamW: the gradient of each step."""
    torch.manual_seed(0)
    model, x = _Mlp(), _fsdp2_data()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    out = []
    for _ in range(steps):
        for j in range(K):
            (model(x[2 * j : 2 * j + 2]) / K).backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return out


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 6), nn.Linear(6, 3)])
        self.out = nn.Linear(3, 1)  # the root's own: FSDP2 shards it with the root

    def forward(self, x):
        return self.out(torch.relu(self.blocks[1](torch.relu(self.blocks[0](x))))).pow(2).mean()


def _fsdp2_worker(rank, world, tmp, sample):
    """FSDP2 as PyTorch documents it: fully_shard each block and the root over a CPU mesh,
    reduce-scatter on the last micro-batch only, AdamW; every rank records."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _Mlp()
    mesh = init_device_mesh("cpu", (world,))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, local = _fsdp2_data(), K // world
    name = f"fsdp2-{sample or 'whole'}.safetensors"
    with ddp_verify_trace.recording(os.path.join(tmp, name), acc_steps=K, sample=sample or "full"):
        for _ in range(2):
            for i in range(local):
                j = rank * local + i  # DistributedSampler's shard of the step's micro-batches
                model.set_requires_gradient_sync(i == local - 1)
                (model(x[2 * j : 2 * j + 2]) / local).backward()
            opt.step()
            opt.zero_grad()


def _rel(got, want):
    return (got - want).abs().max().item() / want.abs().max().item()


def test_an_fsdp2_trace_holds_to_the_schema_with_the_whole_gradients(tmp_path):
    """FSDP2 (DTensor shards, gloo): every rank gathers; the trace holds the whole gradient
    each step applied (the mean over the K micro-batches, as one process accumulating
    them), the engine's facts in the header, and each micro-batch's reduce flag."""
    run_world(_fsdp2_worker, 2, str(tmp_path), None)
    kinds, meta = check_trace(tmp_path / "fsdp2-whole.safetensors")
    assert {"grads", "final", "peak", "micro", "ddp_sync", "comm", "rank_bits"} <= kinds
    assert "scale" not in kinds  # no tensor hook sees FSDP2's per-micro-batch gradients
    assert (meta["run"], meta["world_size"], meta["engine"], meta["grad_divide"]) == ("ddp", "2", "fsdp2", "2.0")
    assert "ddp_forward" not in meta or meta["ddp_forward"] == "none"
    assert "FSDP2" in meta["warnings"]
    with safe_open(str(tmp_path / "fsdp2-whole.safetensors"), "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    for s, want in enumerate(_fsdp2_reference()):
        assert t[f"ddp_sync.{s}"].tolist() == [0, 1] and int(t[f"micro.{s}"]) == 2
        for n, g in want.items():
            assert t[f"grads.{s}.{n}"].shape == g.shape and _rel(t[f"grads.{s}.{n}"], g) < 1e-6, (s, n)


def test_a_sampled_fsdp2_trace_holds_to_the_schema(tmp_path):
    """Sampled, FSDP2's gradients are never gathered whole: each rank's kept positions and
    its shards' summaries, summed over ranks, are the whole tensor's."""
    run_world(_fsdp2_worker, 2, str(tmp_path), 5)
    kinds, meta = check_trace(tmp_path / "fsdp2-5.safetensors")
    assert {"grads", "summary", "positions", "shape", "final", "final_summary"} <= kinds
    assert meta["sample"] == "5" and meta["engine"] == "fsdp2"
    want = _fsdp2_reference()[0]
    with safe_open(str(tmp_path / "fsdp2-5.safetensors"), "pt") as f:
        for n, g in want.items():
            if g.numel() <= 5:
                continue
            kept = f.get_tensor(f"positions.{n}")
            assert _rel(f.get_tensor(f"grads.0.{n}"), g.reshape(-1)[kept]) < 1e-6, n
            total, squares, top = f.get_tensor(f"summary.0.{n}").tolist()
            g64 = g.double()
            assert abs(total - g64.sum().item()) < 1e-6 and abs(squares - (g64 * g64).sum().item()) < 1e-6
            assert top == g64.abs().max().item()


def test_deepspeed_traces_hold_to_the_schema(deepspeed_runs):
    """DeepSpeed ZeRO 1, 2 and 3 recorded by a Session at W=1 and W=2: whole gradients gathered
    from the partitions, the engine and its accumulation in the header, no per-rank checksum
    (its ranks hold partitions) and no magnitudes (its partitions are flat)."""
    from _deepspeed_runs import RECORDED

    for stage in RECORDED:
        for world in (1, 2):
            kinds, meta = check_trace(deepspeed_runs["folder"] / f"w{world}-zero{stage}.safetensors")
            assert {"grads", "final", "peak", "lr", "micro", "clips"} <= kinds, (stage, world)
            assert not kinds & {"rank_bits", "scale", "ddp_sync"}, (stage, world)
            assert meta["engine"] == f"deepspeed-zero{stage}" and meta["run"] == ("ddp" if world > 1 else "single")
            assert "DeepSpeed" in meta["warnings"]
