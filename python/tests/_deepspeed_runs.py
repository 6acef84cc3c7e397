"""DeepSpeed ZeRO runs the tests share (importing deepspeed and starting its worlds is the
slow part: done once per session, by conftest's `deepspeed_runs`): every run of RUNS at W=1
(K=4 micro-batches) and W=2 (K/W=2 each), what the inner optimizer's step hooks saw, a
Session's recording of each stage of RECORDED and of each bfloat16 run of BF16 (DeepSpeed's
other optimizer wrappers), and one of a wrapper the recorder is made not to know."""
import os

import torch

from _world import run_world
from ddp_verify_trace.engines import deepspeed as _deepspeed

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


def _reference(bf16=False, scale=1.0):
    """Plain torch: each micro-batch's gradient, from the same initial weights; `bf16`: of
    the model cast to bfloat16 (as DeepSpeed casts it), its loss times `scale` (DeepSpeed's
    division by gradient_accumulation_steps), as float32."""
    model, out = _model(), []
    if bf16:
        model = model.bfloat16()
    for x, y in _data():
        model.zero_grad()
        if bf16:
            x, y = x.bfloat16(), y.bfloat16()
        (model(x, y) * scale).backward()
        out.append({n: p.grad.float().clone() for n, p in model.named_parameters()})
    return out


# (stage, variant): a bug, or "bf16" (bfloat16 parameters, see BF16).
RUNS = [(1, None), (2, None), (3, None), (2, "reset-every-backward"), (1, "bf16"), (0, "bf16")]
# Stages recorded by a zero-edit Session (the optimizer step hooks of session.py).
RECORDED = [1, 2, 3]
# bfloat16 runs, by stage: the optimizer wrapper DeepSpeed steps through, and the dtype it
# accumulates gradients in ("data_types": {"grad_accum_dtype": ...}). ZeRO 1 with float32
# accumulation is BF16_Optimizer's (flat fp32 partitions, one inner step for all groups);
# stage 0 FP16_UnfusedOptimizer's (a whole fp32 copy of each parameter on every rank).
BF16 = {1: ("BF16_Optimizer", "fp32"), 0: ("FP16_UnfusedOptimizer", "bf16")}


def _worker(rank, world, path):
    """Every run of RUNS in one process per rank (importing deepspeed is the slow part), then
    a Session's recording of each stage of RECORDED, and at W=1 one whose gathering fails."""
    import io
    from contextlib import redirect_stderr

    import deepspeed

    from ddp_verify_trace.session import Session

    # DeepSpeed JIT-builds its shm comm op at init on CPUs unless told it cannot (unused here).
    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    out = {run: _train(rank, world, *run) for run in RUNS}
    folder = os.path.dirname(path)
    for stage in RECORDED:
        session = Session(os.path.join(folder, f"w{world}-zero{stage}.safetensors"), overwrite=True).start()
        _train(rank, world, stage, None, hooks=False)
        session.close()
    for stage in BF16:
        session = Session(os.path.join(folder, f"w{world}-bf16-zero{stage}.safetensors"), overwrite=True).start()
        out[("wrapper", stage)] = _train(rank, world, stage, "bf16", hooks=False, steps=2, wrapper=True)
        session.close()
    # A wrapper the recorder does not know: its steps, learning rates and weights recorded,
    # its gradients not, and the header says so; the training is not disturbed.
    kind_of = _deepspeed.kind_of
    _deepspeed.kind_of = lambda zero: "other"
    try:
        session = Session(os.path.join(folder, f"w{world}-other.safetensors"), overwrite=True).start()
        out["other_steps"] = _train(rank, world, 1, None, hooks=False, steps=2)
        session.close()
    finally:
        _deepspeed.kind_of = kind_of
    if world == 1:
        original = _deepspeed.Zero.full_grad
        _deepspeed.Zero.full_grad = lambda self, p: 1 / 0
        err = io.StringIO()
        try:
            with redirect_stderr(err):
                session = Session(os.path.join(folder, "stopped.safetensors"), overwrite=True).start()
                out["stopped_steps"] = _train(rank, world, 2, None, hooks=False, steps=2)
                session.close()
        finally:
            _deepspeed.Zero.full_grad = original
        out["stopped"] = err.getvalue()
    if rank == 0:
        torch.save(out, path)


def _train(rank, world, stage, bug, hooks=True, steps=1, wrapper=False):
    """One run; returns what the hooks saw, else the steps made (and with `wrapper`, the
    class of DeepSpeed's optimizer wrapper)."""
    import deepspeed
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    local = K // world
    gas = 1 if bug == "reset-every-backward" else local
    model = _model()
    if bug == "bf16":  # two parameter groups: the learning rates are told apart
        weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
        opt = torch.optim.AdamW([{"params": weights}, {"params": biases, "lr": 5e-3}], lr=1e-2)
    else:
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
    if bug == "bf16":
        config["bf16"] = {"enabled": True}
        config["data_types"] = {"grad_accum_dtype": BF16[stage][1]}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    seen = {"pre": {}, "post": {}, "found": []}

    def read(when):
        def hook(optimizer, args, kwargs):
            found = _deepspeed.find_zero(optimizer)
            assert found is not None
            module, named, eng = found
            seen["found"].append((module is engine.module, eng.name, eng.stage, eng.gas, [n for n, _ in named]))
            names = {id(p): n for n, p in named}
            for p in eng.stepping(optimizer):
                seen[when][names[id(p)]] = eng.full_grad(p)
            if when == "post":
                seen["params"] = {n: eng.full_param(p) for n, p in named}
                seen["lrs"] = eng.lrs(optimizer)
                seen["kind"] = (type(eng.zero).__name__, eng.kind, eng.groups())

        return hook

    handles = [register_optimizer_step_pre_hook(read("pre")), register_optimizer_step_post_hook(read("post"))] if hooks else []
    try:
        micro = _data()[rank * local : (rank + 1) * local]
        for _ in range(steps):
            for x, y in micro:
                if bug == "bf16":
                    x, y = x.bfloat16(), y.bfloat16()
                engine.backward(engine(x, y))
                if bug != "reset-every-backward":
                    engine.step()
            if bug == "reset-every-backward":
                engine.step()
    finally:
        for h in handles:
            h.remove()
    assert _deepspeed.find_zero(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1)) is None
    steps_made = engine.global_steps
    kind = type(engine.optimizer).__name__
    engine.destroy()
    if wrapper:
        return kind, steps_made
    return seen if hooks else steps_made


def run_all(folder):
    """{world: {(stage, bug): what the hooks saw}} at W=1 and W=2, and "folder": where the
    Sessions' traces are."""
    out = {"folder": folder}
    for world in (1, 2):
        path = str(folder / f"w{world}.pt")
        run_world(_worker, world, path)
        out[world] = torch.load(path)
    return out
