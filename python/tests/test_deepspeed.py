"""DeepSpeed ZeRO 1/2/3: `_deepspeed.find` recognises the engine's inner optimizer in its step
hooks, and `Engine.full_grad` gathers the gradient it applies, the same at W=1 (K=4 micro-
batches) and W=2 (K/W=2 each) and equal to plain torch's mean of the micro-batch gradients."""
import os
import subprocess
import sys

import pytest
import torch

from _world import run_world
from ddp_verify_trace import _deepspeed

deepspeed = pytest.importorskip("deepspeed")

K = 4


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.fc2(torch.nn.functional.gelu(self.fc1(x))), y)


def _data():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2 * K, 8, generator=g), torch.randn(2 * K, 4, generator=g)
    return [(x[2 * j : 2 * j + 2], y[2 * j : 2 * j + 2]) for j in range(K)]  # micro-batch j


def _model():
    torch.manual_seed(0)
    return MLP()


def _reference():
    """Plain torch: each micro-batch's gradient, from the same initial weights."""
    model, out = _model(), []
    for x, y in _data():
        model.zero_grad()
        model(x, y).backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return out


RUNS = [(1, None), (2, None), (3, None), (2, "reset-every-backward")]
# Stages recorded by a zero-edit Session (the optimizer step hooks of hook.py).
RECORDED = [2, 3]


def _worker(rank, world, path):
    """Every run of RUNS in one process per rank (importing deepspeed is the slow part), then
    a Session's recording of each stage of RECORDED, and at W=1 one whose gathering fails."""
    import io
    from contextlib import redirect_stderr

    from ddp_verify_trace.hook import Session

    # DeepSpeed JIT-builds its shm comm op at init on CPUs unless told it cannot (unused here).
    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    out = {run: _train(rank, world, *run) for run in RUNS}
    folder = os.path.dirname(path)
    for stage in RECORDED:
        session = Session(os.path.join(folder, f"w{world}-zero{stage}.safetensors"), overwrite=True).start()
        _train(rank, world, stage, None, hooks=False)
        session.close()
    if world == 1:
        original = _deepspeed.Engine.full_grad
        _deepspeed.Engine.full_grad = lambda self, p: 1 / 0
        err = io.StringIO()
        try:
            with redirect_stderr(err):
                session = Session(os.path.join(folder, "stopped.safetensors"), overwrite=True).start()
                out["stopped_steps"] = _train(rank, world, 2, None, hooks=False, steps=2)
                session.close()
        finally:
            _deepspeed.Engine.full_grad = original
        out["stopped"] = err.getvalue()
    if rank == 0:
        torch.save(out, path)


def _train(rank, world, stage, bug, hooks=True, steps=1):
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    local = K // world
    gas = 1 if bug == "reset-every-backward" else local
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "train_batch_size": 2 * gas * world,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    seen = {"pre": {}, "post": {}, "found": []}

    def read(when):
        def hook(optimizer, args, kwargs):
            found = _deepspeed.find(optimizer)
            assert found is not None
            module, named, eng = found
            seen["found"].append((module is engine.module, eng.name, eng.stage, eng.gas, [n for n, _ in named]))
            names = {id(p): n for n, p in named}
            for p in eng.stepping(optimizer):
                seen[when][names[id(p)]] = eng.full_grad(p)
            if when == "post":
                seen["params"] = {n: eng.full_param(p) for n, p in named}

        return hook

    handles = [register_optimizer_step_pre_hook(read("pre")), register_optimizer_step_post_hook(read("post"))] if hooks else []
    try:
        micro = _data()[rank * local : (rank + 1) * local]
        for _ in range(steps):
            for x, y in micro:
                engine.backward(engine(x, y))
                if bug != "reset-every-backward":
                    engine.step()
            if bug == "reset-every-backward":
                engine.step()
    finally:
        for h in handles:
            h.remove()
    assert _deepspeed.find(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1)) is None
    steps_made = engine.global_steps
    engine.destroy()
    return seen if hooks else steps_made


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{world: {(stage, bug): what the hooks saw}} at W=1 and W=2, and "folder": where the
    Sessions' traces are."""
    folder = tmp_path_factory.mktemp("deepspeed")
    out = {"folder": folder}
    for world in (1, 2):
        path = str(folder / f"w{world}.pt")
        run_world(_worker, world, path)
        out[world] = torch.load(path)
    return out


def _rel(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b) / max(v.abs().max().item() for v in b.values())


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_full_grad_equal_at_one_and_two_ranks(runs, stage):
    ref = _reference()
    mean = {k: sum(m[k] for m in ref) / K for k in ref[0]}
    one, two = runs[1][(stage, None)], runs[2][(stage, None)]
    for run, gas in ((one, K), (two, K // 2)):
        same, name, got_stage, got_gas, names = run["found"][0]
        assert same and name == f"deepspeed-zero{stage}" and got_stage == stage and got_gas == gas
        assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
        assert set(run["post"]) == set(names)
        assert all(run["post"][k].dtype == torch.float32 and run["post"][k].shape == mean[k].shape for k in names)
        assert _rel(run["pre"], run["post"]) == 0  # the optimizer leaves the gradient it applied
        assert _rel(run["post"], mean) < 1e-6  # averaged over ranks and divided by GAS
    assert _rel(two["post"], one["post"]) < 1e-6
    assert _rel(two["params"], one["params"]) < 1e-6


def test_reset_every_backward_keeps_only_the_last_micro_batch(runs):
    ref = _reference()
    one, two = runs[1][(2, "reset-every-backward")], runs[2][(2, "reset-every-backward")]
    # ZeRO-2, GAS=1: no division, and each backward's boundary drops the gradients before it
    # (ZeRO-1 alike; ZeRO-3 instead keeps the sum of all of them, undivided).
    assert _rel(one["post"], ref[K - 1]) < 1e-6
    # Each rank keeps its last micro-batch; the ranks average.
    assert _rel(two["post"], {k: (ref[1][k] + ref[3][k]) / 2 for k in ref[0]}) < 1e-6


def test_imports_and_finds_nothing_without_deepspeed():
    code = (
        "import sys; sys.modules['deepspeed'] = None\n"
        "import torch\n"
        "from ddp_verify_trace import _deepspeed\n"
        "opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1)\n"
        "assert _deepspeed.find(opt) is None and _deepspeed.engines() == []\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _trace(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("stage", RECORDED)
def test_session_records_the_whole_gradient_and_weights_at_one_and_two_ranks(runs, stage):
    """hook.py's Session under ZeRO: one step of the whole gradient the engine applied (the
    mean of the K micro-batches'), the backwards of this rank, the engine and its
    accumulation in the header, and the same final weights at W=1 and W=2."""
    ref = _reference()
    mean = {k: sum(m[k] for m in ref) / K for k in ref[0]}
    finals = {}
    for world in (1, 2):
        meta, t = _trace(runs["folder"] / f"w{world}-zero{stage}.safetensors")
        assert (meta["steps"], meta["world_size"], meta["framework"]) == ("1", str(world), "deepspeed")
        assert (meta["engine"], meta["engine_accumulation"]) == (f"deepspeed-zero{stage}", str(K // world))
        assert meta["magnitudes"] == "false" and "ddp_forward" not in meta
        assert int(t["micro.0"]) == K // world and t["lr.0"].tolist() == [1e-2]
        assert not any(k.startswith("rank_bits") for k in t)
        assert _rel({k: t[f"grads.0.{k}"] for k in mean}, mean) < 1e-6
        finals[world] = {k: t[f"final.{k}"] for k in mean}
        assert all(t[f"peak.{k}"].shape == mean[k].shape for k in mean)
    assert _rel(finals[2], finals[1]) < 1e-6


def test_a_failing_gather_stops_the_recording_not_the_training(runs):
    assert runs[1]["stopped"].startswith("ddp_verify_trace: recording stopped at optimizer step 0 (in post)")
    assert "ZeroDivisionError" in runs[1]["stopped"]
    assert runs[1]["stopped_steps"] == 2  # the training went on
    assert not (runs["folder"] / "stopped.safetensors").exists()
