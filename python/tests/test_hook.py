"""record(): the optimizer-step hooks record what TraceRecorder records by hand, find the
user's module inside wrappers, see a closure's backward, and write nothing for a failed run."""
import torch
import torch.nn as nn
from safetensors import safe_open

import ddp_verify_trace
from ddp_verify_trace import TraceRecorder


class Wrapper(nn.Module):
    """Stands for DDP's or Accelerate's wrapper: the user's model as `.module`."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def load(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def loop(model, opt, steps=3, acc=2, closure=False, rec=None):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        xs = [torch.randn(4, 3, generator=g) for _ in range(acc)]
        for x in xs[: acc if not closure else acc - 1]:
            (model(x).square().mean() / acc).backward()
        if closure:
            # Lightning's way: the last micro-batch's backward runs inside optimizer.step().
            def run():
                loss = model(xs[-1]).square().mean() / acc
                loss.backward()
                return loss

            opt.step(run)
        else:
            if rec is not None:
                rec.step()
            opt.step()
        opt.zero_grad()


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def test_hooks_record_what_the_hand_recorder_records(tmp_path):
    model, opt = make()
    rec = TraceRecorder(model, tmp_path / "hand.safetensors", optimizer=opt)
    loop(model, opt, rec=rec)
    rec.close()
    model, opt = make()
    with ddp_verify_trace.recording(tmp_path / "hook.safetensors", magnitudes=True):
        # Two wrappers deep, as Colossal-AI's boosted model (its wrapper around DDP's): module.module.
        loop(Wrapper(Wrapper(model)), opt)
    (hand, hmeta), (hook, kmeta) = load(tmp_path / "hand.safetensors"), load(tmp_path / "hook.safetensors")
    assert set(hand) == set(hook)
    for k in hand:
        if not k.startswith("seconds."):  # wall time: no two runs alike
            # Bit for bit, NaN (a stage fact not recorded) equal to NaN.
            same = torch.equal(hand[k], hook[k]) or torch.allclose(hand[k], hook[k], rtol=0, atol=0, equal_nan=True)
            assert same, k
    assert "grads.2.0.weight" in hook and hook["micro.0"].item() == 2
    assert kmeta["optimizer"] == "AdamW" and kmeta["framework"] == "plain" and kmeta["betas"] == "0.9 0.999"


def test_a_closures_backward_is_in_the_recorded_gradient(tmp_path):
    model, opt = make()
    with ddp_verify_trace.recording(tmp_path / "closure.safetensors"):
        loop(model, opt, closure=True)
    model, opt = make()
    with ddp_verify_trace.recording(tmp_path / "plain.safetensors"):
        loop(model, opt)
    closure, _ = load(tmp_path / "closure.safetensors")
    plain, _ = load(tmp_path / "plain.safetensors")
    for k in plain:
        if not k.startswith("seconds."):  # wall time: no two runs alike
            same = torch.equal(plain[k], closure[k])
            assert same or torch.allclose(plain[k], closure[k], rtol=0, atol=0, equal_nan=True), k


def test_a_run_that_raises_writes_nothing(tmp_path):
    model, opt = make()
    try:
        with ddp_verify_trace.recording(tmp_path / "failed.safetensors"):
            loop(model, opt, steps=1)
            raise RuntimeError("data loader broke")
    except RuntimeError:
        pass
    assert not list(tmp_path.iterdir())


def test_a_script_that_raises_leaves_no_file(tmp_path):
    # The zero-edit path: record() at start-up, the trace streamed from the first step, and an
    # exception that ends the script: neither the trace nor its streamed part stays.
    import subprocess
    import sys

    code = (
        "import torch, ddp_verify_trace\n"
        f"ddp_verify_trace.record({str(tmp_path / 't.safetensors')!r})\n"
        "m = torch.nn.Linear(3, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(2):\n    m(torch.ones(2, 3)).sum().backward(); o.step(); o.zero_grad()\n"
        "raise RuntimeError('data loader broke')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and "data loader broke" in out.stderr
    assert not list(tmp_path.iterdir())


def test_framework_callbacks_are_the_frameworks_own_kind(tmp_path):
    import lightning.pytorch as pl
    import transformers

    assert isinstance(ddp_verify_trace.TrainerCallback(tmp_path / "t.safetensors"), transformers.TrainerCallback)
    assert isinstance(ddp_verify_trace.LightningCallback(tmp_path / "l.safetensors"), pl.Callback)


def test_a_grad_scalers_skipped_step_is_recorded_with_its_scale(tmp_path):
    model, opt = make()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, growth_interval=1)
    g = torch.Generator().manual_seed(1)
    with ddp_verify_trace.recording(tmp_path / "amp.safetensors"):
        for _ in range(3):
            scaler.scale(model(torch.randn(4, 3, generator=g)).square().mean() * 1e4).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    t, _ = load(tmp_path / "amp.safetensors")
    scales = [t[f"loss_scale.{s}"].item() for s in range(3)]
    found = [t[f"found_inf.{s}"].item() for s in range(3)]
    # 2^127 times a gradient overflows float32: skipped, halved until it fits.
    assert found[0] == 1.0 and scales[0] == 2.0**127 and scales[1] == 2.0**126, (scales, found)
    assert f"grads.2.0.weight" in t


def test_a_second_optimizers_parameters_are_recorded_beside_the_module(tmp_path):
    # modded-nanogpt's way: one optimizer for the matrices, another for the rest. The first to
    # step is recorded under its module's names; the other's parameters, outside that module,
    # as optimizer1.<group>.<index>, their gradients as its own step found them, from its
    # first step (step 0's window, which the first optimizer's step closed).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    first = torch.optim.SGD(model[0].parameters(), lr=0.1)
    second = torch.optim.Adam(model[2].parameters(), lr=0.1)
    seen = []
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        for _ in range(3):
            model(torch.ones(2, 3)).sum().backward()
            seen.append(model[2].weight.grad.clone())
            first.step()
            second.step()
            first.zero_grad()
            second.zero_grad()
    tensors, meta = load(tmp_path / "t.safetensors")
    assert "unrecorded_optimizers" not in meta and meta["optimizer"] == "SGD"
    # The innermost module holding the first optimizer's parameters: the first Linear.
    finals = sorted(k for k in tensors if k.startswith("final."))
    assert finals == ["final.bias", "final.optimizer1.0.0", "final.optimizer1.0.1", "final.weight"]
    assert torch.equal(tensors["final.optimizer1.0.0"], model[2].weight.detach())
    assert torch.equal(tensors["final.optimizer1.0.1"], model[2].bias.detach())
    for s in (0, 1, 2):
        assert torch.equal(tensors[f"grads.{s}.optimizer1.0.0"], seen[s])
    assert torch.equal(tensors["grads.1.weight"], torch.ones(4, 3) * tensors["grads.1.weight"][:, :1])
    # Step 0 knew only the first optimizer; from step 1 both (SGD's momentum, Adam's betas).
    rows = [tensors[f"groups.{s}"].view(-1, 9) for s in range(3)]
    assert rows[0].shape == (1, 9) and rows[1].shape == (2, 9)
    assert rows[1][0, :4].tolist() == [0.0, 0.0, 2.0, 0.1] and rows[1][0, 8].item() == 0.0
    assert rows[1][1, :6].tolist() == [1.0, 0.0, 2.0, 0.1, 0.0, 0.9] and rows[1][1, 8].isnan()
