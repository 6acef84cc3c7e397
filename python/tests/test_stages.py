"""Stage facts (`_stages/`): what each micro-batch went through on its way to the applied
gradient, as the trace holds it; the expected values are the loop's own numbers."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from torch.nn.parallel import DistributedDataParallel

import ddp_verify_trace
from ddp_verify_trace import _schema
from ddp_verify_trace._stages.fingerprint import ROWS, fingerprint, seen
from ddp_verify_trace._stages.loss import peel
from _world import run_world

FIELD = {f: i for i, f in enumerate(_schema.BATCH_FIELDS)}


def load(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def rows(t, s):
    return t[f"batches.{s}"].view(-1, len(_schema.BATCH_FIELDS))


def test_a_fingerprint_follows_the_first_input_bit_for_bit():
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    fp = lambda *a, **k: int(fingerprint(a, k))  # noqa: E731
    assert fp(x) == fp(x.clone()) == fp((x, torch.ones(2)))  # the first tensor only
    y = x.clone()
    y[3, 2] = y[3, 2].nextafter(torch.tensor(9.0))
    assert fp(y) != fp(x) and fp(x.flip(0)) != fp(x) and fp(x.reshape(3, 4)) != fp(x)
    assert fp(input_ids=torch.arange(5)) != fp(input_ids=torch.arange(1, 6))
    assert fingerprint((3, "a"), {}) is None


def test_each_sample_is_hashed_alike_in_any_grouping():
    x = torch.randn(8, 2, 3, generator=torch.Generator().manual_seed(0))
    hashes = lambda *parts: sorted(v for p in parts for v in seen((p,), {}).rows.tolist())  # noqa: E731
    # Consecutive micro-batches in one process, strided ones on two ranks: the same samples.
    assert hashes(x[:4], x[4:]) == hashes(x[0::2], x[1::2]) == hashes(x)
    y = x.clone()
    y[5, 1, 2] = y[5, 1, 2].nextafter(torch.tensor(9.0))
    assert len(set(hashes(x)) ^ set(hashes(y))) == 2  # one sample changed, one hash
    assert hashes(x.reshape(8, 3, 2)) != hashes(x)  # a sample's shape counts
    assert hashes(torch.arange(6)) == hashes(torch.arange(3), torch.arange(3, 6))
    # A batch above ROWS keeps 1 in `every` rows by hash value: the same rows in any grouping.
    assert seen((torch.zeros(ROWS, 1),), {}).every == 1 and seen((torch.zeros(ROWS + 1, 1),), {}).every == 2


def test_constant_factors_are_peeled_off_the_root():
    w = torch.ones(3, requires_grad=True)
    loss = (w * 2).sum()
    assert float(peel(loss / 4)) == 0.25
    assert float(peel((loss / 4) * 2)) == 0.5
    assert abs(float(peel(loss / torch.tensor(3.0))) - 1 / 3) < 1e-12
    assert peel(loss) == 1.0 and peel(loss * w.sum()) == 1.0  # no constant on top


def _loop(model, opt, k, steps, wrap=None):
    g = torch.Generator().manual_seed(1)
    losses, sums = [], []
    for _ in range(steps):
        for _ in range(k):
            x = torch.randn(4, 3, generator=g)
            loss = F.mse_loss((wrap or model)(x), x.sum(1, keepdim=True))
            losses.append(float(loss))
            (loss / k).backward()
        sums.append({n: float(p.grad.double().sum()) for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, sums


def test_one_process_records_each_loss_and_its_scaling_and_no_local_sums(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        losses, sums = _loop(model, opt, k=2, steps=2)
    t, meta = load(tmp_path / "t.safetensors")
    assert meta["loss_handed_by"] == "plain" and meta["versions"].startswith(f"torch=={torch.__version__}")
    for s in range(2):
        r = rows(t, s)
        assert r.shape[0] == 2 and (r[:, FIELD["rank"]] == 0).all()
        # The model returned no loss; the root is the loss / K, whose constant peels off.
        assert r[:, FIELD["forward"]].isnan().all() and r[:, FIELD["handed"]].isnan().all()
        assert torch.allclose(r[:, FIELD["peeled"]], torch.tensor(losses[2 * s : 2 * s + 2], dtype=torch.float64))
        assert torch.allclose(r[:, FIELD["root"]] * 2, r[:, FIELD["peeled"]])
        assert r[0, FIELD["fingerprint"]] != r[1, FIELD["fingerprint"]]
        # Each micro-batch's 4 samples hashed, all kept, in the rows' order.
        assert r[:, FIELD["samples"]].tolist() == [4, 4] and r[:, FIELD["every"]].tolist() == [1, 1]
        assert t[f"samples.{s}"].numel() == 8 and len(set(t[f"samples.{s}"].tolist())) == 8
        for n, v in sums[s].items():  # what it applied is its local gradient
            assert abs(t[f"grads.{s}.{n}"].double().sum().item() - v) <= 1e-6 * max(1.0, abs(v)), (s, n)
    # One process reduces nothing: the judge reads the local sums from the applied gradients,
    # and no hook pays for them.
    assert not [k for k in t if k.startswith("local.")]


def _ddp_rank(rank, world, path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ddp_verify_trace.recording(path):
        _loop(model, opt, k=2, steps=1, wrap=ddp)


def test_under_ddp_the_local_sums_are_the_ranks_before_the_average(tmp_path):
    path = str(tmp_path / "ddp.safetensors")
    run_world(_ddp_rank, 2, path)
    t, _ = load(path)
    r = rows(t, 0)
    assert r[:, FIELD["rank"]].tolist() == [0, 0, 1, 1]
    for name in ("0.weight", "2.bias"):
        # Each rank's own gradients summed over the ranks: W times the averaged one applied.
        local, applied = t[f"local.0.{name}"].item(), t[f"grads.0.{name}"].double().sum().item()
        assert abs(local - 2 * applied) <= 1e-6 * max(1.0, abs(local)), name


def test_a_frameworks_backward_api_and_its_wrapper_are_recorded(tmp_path):
    from accelerate import Accelerator

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    acc = Accelerator(gradient_accumulation_steps=2, cpu=True)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(1)
    with ddp_verify_trace.recording(tmp_path / "a.safetensors"):
        for _ in range(4):
            with acc.accumulate(model):
                x = torch.randn(4, 3, generator=g)
                acc.backward(F.mse_loss(model(x), x.sum(1, keepdim=True)))
                opt.step()
                opt.zero_grad()
    t, meta = load(tmp_path / "a.safetensors")
    assert (meta["loss_api"], meta["loss_handed_by"], meta["framework_accumulation"]) == ("accelerate", "plain", "2")
    r = rows(t, 0)
    # Handed the plain loss; Accelerate divided it by its accumulation steps.
    assert torch.allclose(r[:, FIELD["handed"]], r[:, FIELD["peeled"]])
    assert torch.allclose(r[:, FIELD["root"]] * 2, r[:, FIELD["handed"]])
    assert [t[f"step_calls.{s}"].item() for s in range(2)] == [2, 2]


class _Flaky(nn.Module):
    """Raises in its forward when told to (after its inner call), else a linear model."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)
        self.fail = False

    def forward(self, x):
        y = self.lin(x)
        if self.fail:
            raise ValueError("bad batch")
        return y


def test_after_the_first_step_the_model_alone_carries_hooks_and_its_facts_go_on(tmp_path):
    torch.manual_seed(0)
    model = _Flaky()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    call = nn.Module.__call__
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        assert nn.Module.__call__ is not call  # finding the outermost calls
        first, _ = _loop(model, opt, k=2, steps=1)
        # The class has its own __call__ back; the outermost module alone carries hooks.
        assert nn.Module.__call__ is call
        assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
        assert not model.lin._forward_pre_hooks and not model.lin._forward_hooks
        model.fail = True
        with pytest.raises(ValueError, match="bad batch"):
            model(torch.ones(2, 3))
        model.fail = False
        later, _ = _loop(model, opt, k=2, steps=2)
    assert not model._forward_pre_hooks and not model._forward_hooks and nn.Module.__call__ is call
    t, _ = load(tmp_path / "t.safetensors")
    losses = first + later
    for s in range(3):
        r = rows(t, s)
        # A forward that raised counts as an outermost call no more once it is over: every
        # later micro-batch is still seen, with its own samples.
        assert r.shape[0] == 2 and r[0, FIELD["fingerprint"]] != r[1, FIELD["fingerprint"]]
        assert torch.allclose(r[:, FIELD["peeled"]], torch.tensor(losses[2 * s : 2 * s + 2], dtype=torch.float64))


def test_the_loss_reduction_is_read_under_its_constant_factors():
    from ddp_verify_trace._stages.loss import peel_to, reduction

    x = torch.randn(4, 3, requires_grad=True)
    y = torch.tensor([0, 1, 2, 0])
    cases = [
        (torch.nn.functional.cross_entropy(x, y) / 4, "mean"),
        (torch.nn.functional.cross_entropy(x, y, reduction="sum") / 8, "sum"),
        (torch.nn.functional.mse_loss(x, torch.zeros(4, 3)) * 2, "mean"),
        ((x**2).mean() / 2, "mean"),
        ((x**2).sum(), "sum"),
        # A copy or a view of the loss is the same loss (TRL's `loss.to(device)`).
        (torch.nn.functional.cross_entropy(x, y).to(torch.float64).view(1).squeeze() / 4, "mean"),
        (torch.nn.functional.mse_loss(x, torch.zeros(4, 3)).clone() * 2, "mean"),
        # A sum of losses, or label smoothing's mix: no one reduction.
        (torch.nn.functional.cross_entropy(x, y, label_smoothing=0.1), None),
        ((x**2).mean() + (x**3).mean(), None),
    ]
    for loss, want in cases:
        factor, node = peel_to(loss)
        assert reduction(node) == want, (loss.grad_fn, want)


class _LossAndLogits(nn.Module):
    """Returns its loss beside its logits, as a Trainer's model does (a dict)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.unused = nn.Linear(2, 2)

    def forward(self, x, y):
        out = self.fc(x)
        return {"logits": out, "loss": F.mse_loss(out, y)}


def _through_ddps_sink(rank, world):
    from ddp_verify_trace._stages.loss import peel_to, reduction

    # find_unused_parameters (Trainer's default) passes every output through DDP's one node.
    model = DistributedDataParallel(_LossAndLogits(), find_unused_parameters=True)
    out = model(torch.randn(3, 4), torch.randn(3, 1))
    assert type(out["loss"].grad_fn).__name__ == "_DDPSinkBackward"
    factor, node = peel_to(out["loss"] / 4)
    assert (factor, reduction(node)) == (0.25, "mean")
    factor, node = peel_to(out["logits"].sum() * 2)
    assert (factor, reduction(node)) == (2.0, "sum")


def test_the_loss_reduction_is_read_through_ddps_node_over_its_outputs():
    run_world(_through_ddps_sink, 1)


def test_what_the_sample_hashes_were_taken_from_is_recorded():
    # A wrapper's whole batch (ids first) and the model's inputs hash other rows: their kinds
    # say so, and the judge compares no hashes of other kinds.
    assert seen((torch.arange(4), torch.zeros(4, 8)), {}).kind == "int64[]"
    assert seen((torch.zeros(4, 8),), {}).kind == "float32[8]"
    assert seen((), {"input_ids": torch.zeros(2, 3, 5, dtype=torch.int32)}).kind == "int32[3,5]"


class _ReturnsItsMean(nn.Module):
    """A model that returns a loss of its own (a mean) beside its output, as a causal LM does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, x, y):
        out = self.lin(x)
        return {"loss": F.mse_loss(out, y), "out": out}


def test_the_forwards_loss_is_kept_only_where_backwards_root_was_made_from_it(tmp_path):
    # A trainer that computes its own loss from the outputs (TRL's SFT: a sum over the tokens
    # over a count of its own) backpropagates another graph than the model's returned mean:
    # that mean is no base of the root's scaling, the peeled loss is.
    torch.manual_seed(0)
    model = _ReturnsItsMean()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        out = model(x, y)
        ((out["out"] - y).pow(2).sum() / 10).backward()  # its own loss: the returned one unused
        out = model(x, y)
        (out["loss"] / 2).backward()  # the returned loss, scaled
        out = model(x, y)
        loss = out["loss"]
        loss *= 3  # scaled in place after the forward (Transformers' `loss *= num_processes`)
        loss.backward()
        opt.step()
        opt.zero_grad()
    t, _ = load(tmp_path / "t.safetensors")
    r = rows(t, 0)
    assert r[0, FIELD["forward"]].isnan() and r[0, FIELD["peeled"]] == pytest.approx(r[0, FIELD["root"]] * 10)
    assert r[1, FIELD["forward"]] == pytest.approx(r[1, FIELD["root"]] * 2)
    assert r[2, FIELD["forward"]] == pytest.approx(r[2, FIELD["root"]] / 3)
