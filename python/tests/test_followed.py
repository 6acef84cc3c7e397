"""What a recording follows beyond each step's gradients (`_followed`, `_extras`, `_perturb`):
every optimizer's param groups per step, each rank's weight checksums, parameters frozen
when it starts and unfrozen later, a second optimizer's own parameters, and the control
run's nudge."""
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from safetensors import safe_open

import ddp_verify_trace
from _world import run_world
from ddp_verify_trace import TraceRecorder, _schema
from test_schema import check_trace


def load(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def rows(t, s):
    return t[f"groups.{s}"].view(-1, len(_schema.GROUP_FIELDS))


def test_groups_rows_follow_a_scheduler_of_the_second_group(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    opt = torch.optim.AdamW(
        [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.05, "weight_decay": 0.0}],
        lr=0.01,
        betas=(0.8, 0.95),
    )
    # Group 0 constant, group 1 halved every step.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 1.0, lambda s: 0.5**s])
    with ddp_verify_trace.recording(tmp_path / "g.safetensors"):
        for _ in range(3):
            model(torch.ones(2, 3)).square().sum().backward()
            opt.step()
            sched.step()
            opt.zero_grad()
    t, _ = load(tmp_path / "g.safetensors")
    check_trace(tmp_path / "g.safetensors")
    for s in range(3):
        r = rows(t, s)
        assert r.shape == (2, 9), r
        assert r[0, :8].tolist() == [0.0, 0.0, 2.0, 0.01, 0.01, 0.8, 0.95, 1e-8]
        assert r[1, :5].tolist() == [0.0, 1.0, 2.0, 0.05 * 0.5**s, 0.0]
        assert math.isnan(r[0, 8]) and math.isnan(r[1, 8])  # AdamW has no momentum


def test_a_parameter_frozen_at_the_start_is_recorded_once_unfrozen(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    for p in [*model[0].parameters(), *model[2].parameters()]:
        p.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # it skips parameters without a gradient
    seen = []
    with ddp_verify_trace.recording(tmp_path / "f.safetensors"):
        for s in range(4):
            if s == 2:
                model[2].weight.requires_grad_(True)  # unfrozen; model[0] stays frozen
            model(torch.ones(2, 3)).square().sum().backward()
            seen.append(model[2].weight.grad.clone() if model[2].weight.grad is not None else None)
            opt.step()
            opt.zero_grad()
    t, meta = load(tmp_path / "f.safetensors")
    check_trace(tmp_path / "f.safetensors")
    assert [f"grads.{s}.2.weight" in t for s in range(4)] == [False, False, True, True]
    for s in (2, 3):
        assert torch.equal(t[f"grads.{s}.2.weight"], seen[s])
    finals = sorted(k for k in t if k.startswith("final."))
    assert finals == ["final.2.weight", "final.4.bias", "final.4.weight"]  # never the frozen base
    assert torch.equal(t["final.2.weight"], model[2].weight.detach())
    assert meta["parameters"] == "5"  # those that trained from the start


def _ranks_worker(rank, world, tmp):
    """DDP, AdamW with a weight decay of each rank's own; an uncertainty weight outside the
    model with its own optimizer, never synchronised. The process group is destroyed
    before the recording closes (the final checksums are gathered there)."""
    os.environ["RANK"] = str(rank)  # who writes, once the process group is gone
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)))
    log_var = nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1 * (1 + rank))
    other = torch.optim.SGD([log_var], lr=0.1)
    g = torch.Generator().manual_seed(rank)
    session = ddp_verify_trace.record(os.path.join(tmp, "w.safetensors"))
    for _ in range(3):
        loss = model(torch.randn(4, 3, generator=g)).square().mean() * torch.exp(-log_var) + log_var
        loss.sum().backward()
        opt.step()
        other.step()
        opt.zero_grad()
        other.zero_grad()
    dist.destroy_process_group()
    session.close()


def test_ranks_weights_checksums_part_where_a_rank_decays_its_own(tmp_path):
    run_world(_ranks_worker, 2, str(tmp_path))
    path = tmp_path / "w.safetensors"
    kinds, meta = check_trace(path)
    assert {"rank_bits", "rank_weights", "rank_final", "groups"} <= kinds
    t, _ = load(path)
    assert meta["run"] == "ddp" and "unrecorded_optimizers" not in meta
    # Step 0 found the weights as DDP broadcast them; step 0's update, decayed apart, parts them.
    w0, w1 = t["rank_weights.0.0.weight"], t["rank_weights.1.0.weight"]
    assert w0.shape == (2,) and w0[0] == w0[1] and w1[0] != w1[1]
    assert t["rank_bits.1.0.weight"][0] == t["rank_bits.1.0.weight"][1]  # DDP's gradients agree
    assert t["rank_final.0.weight"][0] != t["rank_final.0.weight"][1]
    # The uncertainty weight: recorded, its gradient each rank's own, its weights apart too.
    assert "grads.1.optimizer1.0.0" in t and "final.optimizer1.0.0" in t
    assert t["rank_weights.2.optimizer1.0.0"][0] != t["rank_weights.2.optimizer1.0.0"][1]
    assert rows(t, 1)[:, 4].tolist() == [0.1, 0.0]  # rank 0's decay; SGD's group (none)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(x))).square().mean()


def _train(path, how, monkeypatch, scale):
    """Four SGD steps (the applied update is lr x the gradient), recorded `how`: by the hooks,
    by the hooks with a closure (Lightning's way), or by hand. Returns the model and the
    global RNG state before and after training."""
    if scale is None:
        monkeypatch.delenv(_schema.PERTURB_ENV, raising=False)
    else:
        monkeypatch.setenv(_schema.PERTURB_ENV, str(scale))
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, 6, generator=g) for _ in range(4)]
    rng = torch.get_rng_state()
    rec = TraceRecorder(model, path, optimizer=opt) if how == "hand" else ddp_verify_trace.record(path)
    for x in xs:
        if how == "closure":

            def run(x=x):
                loss = model(x)
                loss.backward()
                return loss

            opt.step(run)
        else:
            model(x).backward()
            if how == "hand":
                rec.step()
            opt.step()
        opt.zero_grad()
    rec.close()
    return model, rng, torch.get_rng_state()


@pytest.mark.parametrize("how", ["hooks", "closure", "hand"])
def test_the_control_runs_nudge_is_applied_and_recorded(tmp_path, monkeypatch, how):
    plain, _, _ = _train(tmp_path / "plain.safetensors", how, monkeypatch, None)
    nudged, before, after = _train(tmp_path / "nudged.safetensors", how, monkeypatch, 1e-3)
    assert torch.equal(before, after)  # torch's global RNG as the recorder found it
    t, meta = load(tmp_path / "nudged.safetensors")
    check_trace(tmp_path / "nudged.safetensors")
    assert meta["perturbed"] == "0.001" and "warnings" not in meta
    assert "perturbed" not in load(tmp_path / "plain.safetensors")[1]
    for n, p in nudged.named_parameters():
        q = dict(plain.named_parameters())[n]
        rel = ((p - q).abs().max() / q.abs().max()).item()
        assert 0 < rel < 1e-2, (n, rel)
        # What the trace says was applied is what was: SGD's weight is the first minus lr x grads.
        first = t[f"final.{n}"] + 0.1 * sum(t[f"grads.{s}.{n}"] for s in range(4))
        back = p.detach() + 0.1 * sum(t[f"grads.{s}.{n}"] for s in range(4))
        assert torch.allclose(first, back, atol=1e-6)
    torch.manual_seed(0)
    start = _Net()
    for n, p in start.named_parameters():
        back = t[f"final.{n}"] + 0.1 * sum(t[f"grads.{s}.{n}"] for s in range(4))
        assert torch.allclose(back, p.detach(), atol=1e-5), n


def test_a_nudge_that_cannot_be_applied_is_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv(_schema.PERTURB_ENV, "not a number")
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ddp_verify_trace.recording(tmp_path / "bad.safetensors"):
        model(torch.ones(2, 6)).backward()
        opt.step()
    _, meta = load(tmp_path / "bad.safetensors")
    assert "perturbed" not in meta and _schema.PERTURB_ENV in meta["warnings"]
