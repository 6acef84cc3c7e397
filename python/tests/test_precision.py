"""The precision facts the recorder keeps (docs/mixed-precision.md): each micro-batch's
autocast on every rank, the dtype backward ran on, an engine's reduction dtype, and the
precision control's division reaching the gradients of the copies an engine computes with."""
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from torch.nn.parallel import DistributedDataParallel

import ddp_verify_trace
from ddp_verify_trace import _divisor, _schema, _watch
from _world import run_world


def load(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _rank_autocast(rank, world, path, off_on):
    """Two micro-batches per step; rank `off_on` enters no autocast, the others bfloat16's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    with ddp_verify_trace.recording(path):
        for _ in range(2):
            for _ in range(2):
                x = torch.randn(4, 3, generator=g)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=rank != off_on):
                    loss = F.mse_loss(ddp(x).float(), x.sum(1, keepdim=True))
                (loss / 2).backward()
            opt.step()
            opt.zero_grad()


def test_each_ranks_autocast_is_recorded_per_micro_batch(tmp_path):
    path = str(tmp_path / "ddp.safetensors")
    run_world(_rank_autocast, 2, path, 1)
    t, meta = load(path)
    for s in range(2):
        # Rows in rank order: rank 0's two micro-batches under bfloat16 (8 digits), rank 1's off.
        assert t[f"autocast.{s}"].tolist() == [8.0, 8.0, 0.0, 0.0]
        assert t[f"batches.{s}"].numel() == 4 * len(_schema.BATCH_FIELDS)
    # The losses were cast back to float32 before backward.
    assert meta[_schema.Key.LOSS_DTYPE] == _schema.Dtype.FLOAT32


def test_runs_with_no_autocast_write_none(tmp_path):
    path = str(tmp_path / "ddp.safetensors")
    run_world(_rank_autocast, 2, path, -2)  # every rank under bfloat16
    t, _ = load(path)
    assert t["autocast.0"].tolist() == [8.0] * 4
    model = nn.Linear(3, 1)
    with ddp_verify_trace.recording(tmp_path / "one.safetensors"):
        model(torch.ones(2, 3)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    t, _ = load(tmp_path / "one.safetensors")
    assert not [k for k in t if k.startswith("autocast.")]


class _CopyEngine(nn.Module):
    """An engine's way: the forward computes with a copy of the weight (a leaf of its own),
    whose gradient the engine adds into the parameter's after backward."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([[0.5, -1.0, 2.0]]))
        self.copy = None

    def forward(self, x):
        self.copy = self.weight.detach().clone().requires_grad_()
        return x @ self.copy.t()

    def reduce(self):
        self.weight.grad = self.copy.grad.clone() if self.weight.grad is None else self.weight.grad + self.copy.grad


def _control_grad(monkeypatch, tmp_path, divisor):
    monkeypatch.setenv(_schema.DIVISOR_ENV, divisor)
    model = _CopyEngine()
    with ddp_verify_trace.recording(tmp_path / f"{divisor or 'plain'}.safetensors"):
        for x in (torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.5, 0.25, -1.0]])):
            (model(x).sum() / 2).backward()
            model.reduce()
        grad = model.weight.grad.clone()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    return grad


def test_the_precision_control_divides_the_gradients_of_an_engines_own_copies(monkeypatch, tmp_path):
    plain = _control_grad(monkeypatch, tmp_path, "")
    control = _control_grad(monkeypatch, tmp_path, "3")
    # Seeded by 3 and divided back where the copy's gradient is made: the same gradient, not 3x.
    assert torch.allclose(control, plain, rtol=1e-6), (control, plain)
    assert _divisor.ACTIVE is None  # the recording put everything back


def test_an_fsdp2_reduction_narrower_than_the_gradients_is_a_fact():
    from ddp_verify_trace.engines.fsdp2 import Fsdp2, _backward_ended

    grad = torch.zeros(2, dtype=torch.bfloat16)
    param = SimpleNamespace(
        _unsharded_param=True,
        unsharded_param=SimpleNamespace(grad=grad),
        sharded_param=torch.zeros(2),
        orig_dtype=torch.float32,
        param_dtype=torch.bfloat16,
    )
    watch = _watch.Watch()
    watch.local_grad = lambda *a: None
    # No reduce_dtype set: up to torch 2.14 the gradients reduce in their own dtype.
    group = SimpleNamespace(gradient_divide_factor=None, mp_policy=None, fsdp_params=[param], _reduce_dtype=None)
    _backward_ended(watch, group, True)
    facts = Fsdp2().step_facts(watch, 2, [True])
    assert facts[_schema.Key.REDUCE_DTYPE] == _schema.Dtype.BFLOAT16
    # A reduce_dtype of float32 (or, from 2.15, the promotion to it) is no narrow reduction.
    group._reduce_dtype = torch.float32
    _backward_ended(watch, group, True)
    assert _schema.Key.REDUCE_DTYPE not in Fsdp2().step_facts(watch, 2, [True])
