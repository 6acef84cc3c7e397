"""TraceRecorder against values computed apart from it: `.grad` at step time, each micro-batch's
gradient from torch.autograd.grad on a functional copy, the weights seen along the way, and a
real two-process gloo world for DDP."""
import contextlib
import os

import pytest
import torch
import torch.nn as nn
from safetensors import safe_open
from torch.func import functional_call

from _world import run_world
from ddp_verify_trace import TraceRecorder, _schema


class Net(nn.Module):
    """Linear, BatchNorm (float buffers and an int64 counter), Linear; optionally a layer that
    forward never uses, whose gradient stays None."""

    def __init__(self, unused=True):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.out = nn.Linear(3, 2)
        self.unused = nn.Linear(2, 2) if unused else None

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x)))).sum()


def load(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def batches(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 4, generator=g) for _ in range(n)]


def train(model, rec, xs, acc, lr=0.5):
    """Gradient accumulation (under DDP: no_sync but for the last micro-batch) with SGD; returns
    what the recorder should have recorded, computed without it."""
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    module = model.module if ddp else model
    params = {n: p for n, p in module.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    peaks = {n: p.detach().abs() for n, p in params.items()}
    expect = {"grads": [], "scale": [], "initial": {n: p.detach().clone() for n, p in params.items()}}
    for s in range(len(xs) // acc):
        window = xs[s * acc:(s + 1) * acc]
        # Each micro-batch's own gradient, on copies (no hooks, buffers untouched).
        copies = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
        state = {**copies, **{n: b.clone() for n, b in module.named_buffers()}}
        scale = {n: torch.zeros_like(p) for n, p in params.items()}
        top = {n: torch.zeros(()) for n in params}  # per tensor: the sum of each backward's max |g|
        for x in window:
            gs = torch.autograd.grad(functional_call(module, state, (x,)) / acc, list(copies.values()), allow_unused=True)
            for n, g in zip(copies, gs):
                if g is not None:
                    scale[n] += g.abs()
                    top[n] += g.abs().max()
        for i, x in enumerate(window):
            sync = not ddp or i == acc - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                (model(x) / acc).backward()
        for n, p in params.items():
            torch.maximum(peaks[n], p.detach().abs(), out=peaks[n])
        rec.step()
        expect["grads"].append({n: p.grad.clone() for n, p in params.items() if p.grad is not None})
        expect["scale"].append({n: scale[n] for n in expect["grads"][-1]})
        expect.setdefault("top", []).append({n: top[n] for n in expect["grads"][-1]})
        opt.step()
        opt.zero_grad()
    for n, p in params.items():
        torch.maximum(peaks[n], p.detach().abs(), out=peaks[n])
    expect["peak"] = peaks
    expect["final"] = {n: p.detach().clone() for n, p in params.items()}
    expect["buffer"] = {n: b.clone() for n, b in module.named_buffers()}
    return expect


def assert_recorded(t, expect, steps):
    for s in range(steps):
        for n, g in expect["grads"][s].items():
            assert torch.equal(t[f"grads.{s}.{n}"], g), (s, n)
            assert torch.equal(t[f"scale.{s}.{n}"], expect["scale"][s][n]), (s, n)
    for what in ("peak", "final", "buffer"):
        for n, v in expect[what].items():
            assert torch.equal(t[f"{what}.{n}"], v), (what, n)


@pytest.fixture
def run(tmp_path):
    """One accumulation run (4 steps of 2 micro-batches) recorded into a not yet existing folder."""
    torch.manual_seed(0)
    model = Net()
    path = tmp_path / "new" / "dir" / "acc.safetensors"
    rec = TraceRecorder(model, path, acc_steps=2, steps_per_epoch=4)
    expect = train(model, rec, batches(8, seed=1), acc=2)
    rec.close()
    return model, path, expect


def test_layout_and_metadata(run):
    model, path, expect = run
    t, meta = load(path)
    names = [n for n, _ in model.named_parameters()]
    used = [n for n in names if not n.startswith("unused.")]
    want = {f"{k}.{s}.{n}" for k in ("grads", "scale") for s in range(4) for n in used}
    want |= {f"{k}.{n}" for k in ("peak", "final") for n in names}
    want |= {f"buffer.{n}" for n, _ in model.named_buffers()}
    # Each step's record beside its gradients: backward passes, clip_grad_norm_ calls.
    want |= {f"{k}.{s}" for k in ("micro", "clips") for s in range(4)}
    # The wall seconds of each step after the first.
    want |= {f"seconds.{s}" for s in range(1, 4)}
    # Stage facts: each step's micro-batches and their samples (one process: no local sums,
    # which the judge reads from the applied gradients).
    want |= {f"{k}.{s}" for k in ("batches", "samples") for s in range(4)}
    assert set(t) == want
    assert [t[f"micro.{s}"].item() for s in range(4)] == [2] * 4
    assert [t[f"clips.{s}"].item() for s in range(4)] == [0] * 4
    assert not os.path.exists(str(path) + ".part")
    assert meta.pop("versions").startswith("torch==")
    assert len(meta.pop("start_weights")) == 16  # the weights' checksum as step 0 found them
    assert meta == {
        "loss_handed_by": "plain", "backward_by": "plain", "loss_reduction": "sum",  # the model sums
        "loss_dtype": "float32", "samples_from": "float32[4]",
        "format": _schema.FORMAT, "run": "single", "world_size": "1", "dtype": "float32",
        "torch_version": torch.__version__, "steps": "4", "magnitudes": "true",
        "acc_steps": "2", "steps_per_epoch": "4", "parameters": str(sum(p.numel() for p in model.parameters())),
        "coupled": "1 BatchNorm layer in training mode",
    }
    assert t["buffer.bn.num_batches_tracked"].dtype == torch.int64
    floats = {k: v for k, v in t.items() if not k.endswith("num_batches_tracked") and not k.startswith(("micro.", "clips.", "seconds.", "batches.", "samples.", "local."))}
    assert all(v.dtype == torch.float32 and v.is_contiguous() for v in floats.values())


def test_values_match_independent_computation(run):
    model, path, expect = run
    t, _ = load(path)
    assert_recorded(t, expect, steps=4)
    assert t["buffer.bn.num_batches_tracked"].item() == 8  # one per forward
    # Not vacuous: micro-batch gradients cancel somewhere, and weights shrank below their peak
    # and grew beyond their start somewhere.
    assert any((t[f"scale.0.{n}"] > t[f"grads.0.{n}"].abs()).any() for n in expect["grads"][0])
    assert any((t[f"peak.{n}"] > t[f"final.{n}"].abs()).any() for n in expect["peak"])
    assert any((t[f"peak.{n}"] > expect["initial"][n].abs()).any() for n in expect["peak"])


def test_without_magnitudes_or_counts(tmp_path):
    model = Net()
    path = tmp_path / "t.safetensors"
    with TraceRecorder(model, path, magnitudes=False) as rec:
        train(model, rec, batches(2, seed=2), acc=1)
    t, meta = load(path)
    assert not [k for k in t if k.startswith("scale.")]
    assert [k for k in t if k.startswith("grads.1.")]
    assert meta["magnitudes"] == "false" and meta["steps"] == "2"
    assert "acc_steps" not in meta and "steps_per_epoch" not in meta


def test_overwrite_refused_unless_asked(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"earlier")
    with pytest.raises(FileExistsError, match="overwrite=True") as e:
        TraceRecorder(Net(), path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert path.read_bytes() == b"earlier"
    model = Net()
    TraceRecorder(model, path, overwrite=True).close()
    assert load(path)[1]["steps"] == "0"


def test_context_manager_writes_nothing_on_exception(tmp_path):
    model = Net()
    path = tmp_path / "t.safetensors"
    with pytest.raises(ZeroDivisionError):
        with TraceRecorder(model, path) as rec:
            train(model, rec, batches(2, seed=3), acc=2)
            1 / 0
    assert list(tmp_path.iterdir()) == []
    assert all(not p._backward_hooks for p in model.parameters())  # the hooks are gone too
    with pytest.raises(RuntimeError, match="abandoned"):
        rec.close()


def test_misuse_is_refused(tmp_path):
    rec = TraceRecorder(Net(), tmp_path / "t.safetensors")
    rec.close()
    with pytest.raises(RuntimeError, match="close"):
        rec.close()
    with pytest.raises(RuntimeError, match="step"):
        rec.step()
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="mix"):
        TraceRecorder(mixed, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="acc_steps"):
        TraceRecorder(Net(), tmp_path / "a.safetensors", acc_steps="2")


def _ddp_tensor_worker(rank, world, tmp):
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net(unused=False))
    rec = TraceRecorder(model, os.path.join(tmp, "t.safetensors"), acc_steps=2 * world, magnitudes="tensor")
    expect = train(model, rec, batches(4, seed=10 + rank), acc=2)
    rec.close()
    torch.save(expect, os.path.join(tmp, f"expect{rank}.pt"))


def test_ddp_per_tensor_magnitudes_are_averaged_over_ranks_in_the_steps_one_gather(tmp_path):
    # Per tensor, the ranks' magnitudes ride the step's all_gather (no all_reduce of their
    # own) and are averaged there as DDP averages gradients: as an all_reduce made them.
    run_world(_ddp_tensor_worker, 2, str(tmp_path))
    t, meta = load(tmp_path / "t.safetensors")
    assert meta["magnitudes"] == "per tensor"
    e0, e1 = (torch.load(tmp_path / f"expect{r}.pt") for r in (0, 1))
    for s in range(2):
        for n, a in e0["top"][s].items():
            want = (a + e1["top"][s][n]) / 2
            assert torch.equal(t[f"scale.{s}.{n}"].reshape(()), want), (s, n)
            assert torch.equal(t[f"grads.{s}.{n}"], e0["grads"][s][n])


def _ddp_worker(rank, world, tmp):
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net(unused=False))
    # Rank 1's path exists already: it must neither refuse nor touch it.
    path = os.path.join(tmp, f"rank{rank}.safetensors")
    if rank == 1:
        with open(path, "wb") as f:
            f.write(b"sentinel")
    rec = TraceRecorder(model, path, acc_steps=2 * world)
    expect = train(model, rec, batches(4, seed=10 + rank), acc=2)
    rec.close()
    torch.save(expect, os.path.join(tmp, f"expect{rank}.pt"))


def test_ddp_two_processes(tmp_path):
    run_world(_ddp_worker, 2, str(tmp_path))
    assert (tmp_path / "rank1.safetensors").read_bytes() == b"sentinel"
    assert not list(tmp_path.glob("*.part"))
    t, meta = load(tmp_path / "rank0.safetensors")
    assert meta["run"] == "ddp" and meta["world_size"] == "2" and meta["steps"] == "2" and meta["acc_steps"] == "4"
    assert not [k for k in t if "module." in k]
    e0, e1 = (torch.load(tmp_path / f"expect{r}.pt") for r in (0, 1))
    # DDP averages the ranks' gradients, so the magnitudes are averaged likewise.
    e0["scale"] = [{n: (a[n] + b[n]) / 2 for n in a} for a, b in zip(e0["scale"], e1["scale"])]
    assert_recorded(t, e0, steps=2)
    for s in range(2):
        for n, g in e1["grads"][s].items():
            assert torch.equal(t[f"grads.{s}.{n}"], g)  # both ranks stepped with the same gradient
