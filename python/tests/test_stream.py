"""The trace streamed to disk: any safetensors reader reads it back exactly, every tensor's
offset is a multiple of its item size, a header too big for the reserved room still gives
a valid file, and gradients lent to the writer (not copied) are recorded as they were
applied, however the loop zeroes them."""
import json
import struct
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file
from torch.optim.optimizer import register_optimizer_step_post_hook

import ddp_verify_trace
from ddp_verify_trace import _stream


def tensors():
    g = torch.Generator().manual_seed(0)
    big = [(f"grads.0.w{i}", torch.randn(5 + i, 3, generator=g)) for i in range(4)]
    small = {
        "micro.0": torch.tensor([2], dtype=torch.int64),
        "lr.0": torch.tensor([0.1, 0.01], dtype=torch.float64),
        "scale.0.w0": torch.tensor(0.5),
        "odd.bf16": torch.randn(3, generator=g).to(torch.bfloat16),
        "odd.i16": torch.tensor([1, 2, 3], dtype=torch.int16),
        "final.w0": torch.randn(7, generator=g),
    }
    return big, small


def write(path, big, small):
    s = _stream.Stream(str(path))
    s.put(big[:2], lent=big[2:])
    for name, t in small.items():
        s.keep(name, t)
    s.close({"format": "test"})


def offsets(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__")
    return 8 + n, header


@pytest.mark.parametrize("reserved", [_stream.RESERVED, 64])
def test_read_back_exactly_and_aligned(tmp_path, monkeypatch, reserved):
    # 64 bytes cannot hold the header: the streamed bytes are moved once into a new file.
    monkeypatch.setattr(_stream, "RESERVED", reserved)
    big, small = tensors()
    path = tmp_path / "t.safetensors"
    write(path, big, small)
    back = load_file(str(path))
    assert set(back) == {n for n, _ in big} | set(small)
    for name, t in list(big) + list(small.items()):
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    start, header = offsets(path)
    for name, entry in header.items():
        size = back[name].element_size()
        assert (start + entry["data_offsets"][0]) % size == 0, name
    assert not list(tmp_path.glob("*.part*"))


def test_abandoned_stream_leaves_nothing(tmp_path):
    s = _stream.Stream(str(tmp_path / "t.safetensors"))
    s.put(tensors()[0])
    s.abandon()
    assert not list(tmp_path.iterdir())


def zero_none(model, opt):
    opt.zero_grad(set_to_none=True)


def zero_in_place(model, opt):
    opt.zero_grad(set_to_none=False)


def zero_by_hand(model, opt):
    for p in model.parameters():
        p.grad.zero_()


def zero_data_by_hand(model, opt):
    # .data has its own version counter: nothing sees this write.
    for p in model.parameters():
        p.grad.data.zero_()


@pytest.mark.parametrize("zero", [zero_none, zero_in_place, zero_by_hand, zero_data_by_hand])
def test_recorded_gradients_are_the_applied_ones_however_the_loop_zeroes(tmp_path, zero):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    applied = []

    def keep(optimizer, args, kwargs):
        applied.append({n: p.grad.clone() for n, p in model.named_parameters()})

    path = tmp_path / "t.safetensors"
    g = torch.Generator().manual_seed(1)
    with ddp_verify_trace.recording(path, model=model):
        # Registered after the recorder's: sees the gradients the step applied.
        handle = register_optimizer_step_post_hook(keep)
        for _ in range(6):
            for _ in range(2):
                (model(torch.randn(16, 64, generator=g)).square().mean() / 2).backward()
            opt.step()
            zero(model, opt)
        handle.remove()
    back = load_file(str(path))
    for s, grads in enumerate(applied):
        for n, grad in grads.items():
            assert torch.equal(back[f"grads.{s}.{n}"], grad), (s, n)


def test_a_trace_is_written_without_numpy(tmp_path):
    # torch does not require NumPy (torch 2.4's and 2.5's wheels install without it), so the
    # recorder must not need it either: Tensor.numpy() fails there with "Numpy is not available".
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "import torch, ddp_verify_trace\n"
        "try:\n    torch.zeros(1).numpy()\nexcept RuntimeError:\n    pass\n"
        "else:\n    raise SystemExit('numpy was importable')\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Linear(3, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        f"with ddp_verify_trace.recording({str(tmp_path / 't.safetensors')!r}):\n"
        "    for _ in range(2):\n"
        "        m(torch.ones(4, 3)).sum().backward(); o.step(); o.zero_grad()\n"
        f"torch.save({{k: v.detach() for k, v in m.named_parameters()}}, {str(tmp_path / 'final.pt')!r})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    back = load_file(str(tmp_path / "t.safetensors"))
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert torch.equal(back["final.weight"], final["weight"]) and torch.equal(back["final.bias"], final["bias"])
    assert torch.equal(back["grads.1.bias"], torch.full((2,), 4.0))
