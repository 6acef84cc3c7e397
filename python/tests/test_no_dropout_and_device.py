"""The two changes a run asks of the recorder through its environment (`_no_dropout`,
`_cpu_device`): `--no-dropout` makes every dropout the identity and the header says so (and
names no dropout that trains); `--device cpu` runs a script's hard-coded CUDA and NCCL on the
CPU with gloo, says in the header what it mapped, and refuses in one line what it cannot map.
Both leave torch as found once the recording closes, and neither patches anything unasked."""
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_verify_trace
from ddp_verify_trace import _patches, _schema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def header(path):
    with safe_open(str(path), "pt") as f:
        return f.metadata()


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)
        self.drops = nn.ModuleList([nn.Dropout(0.1), nn.Dropout(0.3), nn.Dropout1d(0.2), nn.AlphaDropout(0.2)])
        self.rnn = nn.LSTM(8, 8, num_layers=2, dropout=0.25, batch_first=True)

    def forward(self, x):
        h = self.drops[0](self.a(x)).relu()
        h = self.drops[1](h) + self.drops[2](h.unsqueeze(-1)).squeeze(-1) + self.drops[3](h)
        h = self.rnn(h.unsqueeze(1))[0].squeeze(1)
        q = h.view(2, 1, -1, 4)
        h = h + F.scaled_dot_product_attention(q, q, q, dropout_p=0.4).reshape(h.shape)
        return self.b(F.dropout(h, 0.2, training=self.training))


def train(model, steps=2):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(6, 4, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_no_dropout_makes_every_dropout_the_identity(tmp_path, monkeypatch, torch_as_found):
    monkeypatch.setenv(_schema.NO_DROPOUT_ENV, "1")
    torch.manual_seed(0)
    model, x = WithDropout(), torch.randn(6, 4)
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        # Imported after start-up, as a script imports it: the patched one.
        from torch.nn.functional import dropout

        with torch.no_grad():
            assert torch.equal(model.train()(x), model.eval()(x))
        model.train()
        assert torch.equal(dropout(x, 0.5), x) and torch.equal(F.dropout2d(x.view(1, 6, 4, 1), 0.5).view(6, 4), x)
        y = x.clone()
        assert F.dropout(y, 0.5, True, True) is y and torch.equal(y, x)  # inplace: the input, unchanged
        assert torch.equal(torch.dropout(x, 0.5, True), x) and torch.equal(torch.feature_dropout(x, p=0.5, train=True), x)
        assert torch.equal(torch.alpha_dropout(x, 0.5, True), x)
        q = torch.randn(2, 3, 5, 4)
        plain = F.scaled_dot_product_attention(q, q, q)
        assert torch.equal(F.scaled_dot_product_attention(q, q, q, None, 0.5), plain)  # positional
        assert torch.equal(F.scaled_dot_product_attention(q, q, q, dropout_p=0.5), plain)
        train(model)
    torch_as_found.check()
    meta = header(tmp_path / "t.safetensors")
    assert _schema.Key.DROPOUT not in meta  # no dropout trains: the judge must not name it
    said = meta[_schema.Key.DROPOUT_OFF]
    assert said.startswith("every dropout made the identity (--no-dropout): 4 dropout layers, p up to 0.3"), said
    for met in ("scaled_dot_product_attention dropout_p up to 0.5", "F.dropout p up to 0.5", "LSTM dropout p up to 0.25",
                "torch.dropout p up to 0.5", "F.dropout2d p up to 0.5"):  # fmt: skip
        assert met in said, said
    assert "\n" not in said
    # Dropout draws masks again once the recording closed.
    assert not torch.equal(F.dropout(torch.ones(100), 0.5), torch.ones(100))


def test_dropout_is_named_where_it_is_not_off(tmp_path, torch_as_found):
    torch.manual_seed(0)
    model = WithDropout()
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        assert not torch.equal(F.dropout(torch.ones(100), 0.5), torch.ones(100))
        train(model)
        names = {f"{p.owner.__name__}.{p.name}" for p in _patches.made()}
        assert not names & {"Tensor.to", "functional.dropout", "Dropout.forward", "torch.zeros"}, names
    torch_as_found.check()
    meta = header(tmp_path / "t.safetensors")
    assert meta[_schema.Key.DROPOUT] == "4 dropout layers, p up to 0.3"
    assert _schema.Key.DROPOUT_OFF not in meta and _schema.Key.DEVICE_MAPPED not in meta


@pytest.mark.parametrize("env,value", [(_schema.NO_DROPOUT_ENV, "yes"), (_schema.DEVICE_ENV, "cuda")])
def test_a_wrong_setting_is_refused_before_anything_is_patched(tmp_path, monkeypatch, torch_as_found, env, value):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=f"{env}='{value}'"):
        ddp_verify_trace.record(tmp_path / "t.safetensors")
    torch_as_found.check()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x):
        return self.b(self.a(x).relu())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.filterwarnings("ignore:.*torch.cuda.amp.GradScaler:FutureWarning")
def test_device_cpu_runs_a_cuda_hard_coded_loop_on_the_cpu(tmp_path, monkeypatch, torch_as_found):
    monkeypatch.setenv(_schema.DEVICE_ENV, "cpu")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", free_port())
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    torch.save({"w": torch.ones(2)}, tmp_path / "ckpt.pt")
    excepthook = sys.excepthook  # init_process_group sets torch's own: not the recorder's to undo
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        # nanoGPT's set-up, CUDA and NCCL hard-coded.
        dist.init_process_group(backend="nccl", device_id=torch.device("cuda", 0))
        try:
            assert dist.get_backend() == "gloo"
            local = 0
            device = f"cuda:{local}"
            torch.cuda.set_device(device)
            torch.cuda.manual_seed(0)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.manual_seed(0)
            model = Net().to(device)
            assert model.cuda() is model and next(model.parameters()).device.type == "cpu"
            model = DDP(model, device_ids=[local], output_device=local)
            opt = torch.optim.AdamW(model.parameters(), lr=0.01)
            scaler = torch.cuda.amp.GradScaler(enabled=True)
            assert scaler.is_enabled() and scaler._device == "cpu"  # the CPU's GradScaler
            assert torch.load(tmp_path / "ckpt.pt", map_location=device)["w"].device.type == "cpu"
            for step in range(2):
                x = torch.randn(8, 4, device=torch.device("cuda", local))
                x = x.pin_memory().to(device, non_blocking=True)
                y = torch.zeros(8, 1, device="cuda").to(local)
                assert x.device.type == y.device.type == x.cuda().device.type == "cpu"
                with torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16):
                    out = model(x)
                    assert out.dtype == torch.bfloat16  # the CPU's bfloat16 autocast
                with torch.autocast(device_type="cuda"):  # float16 by default: the CPU's float16
                    assert model(x).dtype == torch.float16
                scaler.scale(F.mse_loss(out.float(), y)).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
                torch.cuda.synchronize()
            dist.barrier(device_ids=[local])
        finally:
            dist.destroy_process_group()
            sys.excepthook = excepthook
    torch_as_found.check()
    assert "to" not in vars(torch.Tensor)  # TensorBase's, as found: not a copy set on torch.Tensor
    meta = header(tmp_path / "t.safetensors")
    said = meta[_schema.Key.DEVICE_MAPPED]
    assert meta["steps"] == "2" and "\n" not in said
    for part in (
        "cuda -> cpu: Module.to, Module.cuda, torch.load(map_location=), torch.randn(device=), Tensor.to, "
        "torch.zeros(device=), Tensor.cuda;",
        "nccl -> gloo: init_process_group;",
        "dropped: init_process_group device_id, DDP device_ids, DDP output_device, barrier device_ids;",
        "no-ops: torch.cuda.set_device, torch.cuda.manual_seed, Tensor.pin_memory, torch.cuda.synchronize;",
        "autocast(cuda, bfloat16) -> autocast(cpu, bfloat16)",
        "GradScaler(cuda) -> GradScaler(cpu)",
        "autocast(cuda, float16) -> autocast(cpu, float16)",
    ):
        assert part in said, said
    assert said.startswith("cuda -> cpu:")


def test_device_cpu_answers_the_scripts_cuda_questions_as_its_mapping_implies(tmp_path, monkeypatch, torch_as_found):
    monkeypatch.setenv(_schema.DEVICE_ENV, "cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    truth = torch.cuda.is_available()
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        # timm's and nanoGPT's checks, from the script's own code.
        assert torch.cuda.is_available() and torch.cuda.device_count() == 3 and torch.cuda.is_bf16_supported()
        # torch's own code gets the truth: it takes no CUDA-only path of its own.
        from torch.random import fork_rng

        with fork_rng():  # asks torch.cuda.device_count() inside torch: the truth, or it would seed CUDA
            pass
        model = nn.Linear(2, 1)
        model(torch.ones(1, 2)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.cuda.is_available() or truth  # put back as found
    said = header(tmp_path / "t.safetensors")[_schema.Key.DEVICE_MAPPED]
    assert "answered: torch.cuda.is_available() -> True, torch.cuda.device_count() -> 3, " in said, said
    assert "torch.cuda.is_bf16_supported() -> True" in said, said


def test_device_cpu_refuses_what_has_no_cpu_meaning_in_one_line(tmp_path, monkeypatch, torch_as_found):
    monkeypatch.setenv(_schema.DEVICE_ENV, "cpu")
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        for name, call in (
            ("Stream", lambda: torch.cuda.Stream()),
            ("Event", lambda: torch.cuda.Event(enable_timing=True)),
            ("CUDAGraph", lambda: torch.cuda.CUDAGraph()),
            ("get_device_properties", lambda: torch.cuda.get_device_properties(0)),
            ("current_stream", lambda: torch.cuda.current_stream()),
        ):
            with pytest.raises(RuntimeError) as e:
                call()
            assert str(e.value).startswith(f"ddp_verify_trace: --device cpu cannot run torch.cuda.{name} on the CPU; ")
            assert "\n" not in str(e.value)
        assert not isinstance(object(), torch.cuda.Stream)  # still a class to isinstance
        assert torch.cuda.current_device() == 0
        train(Net())
    torch_as_found.check()
    # What was refused is no mapping: the header says what ran, where a trace is written at all.
    assert header(tmp_path / "t.safetensors")[_schema.Key.DEVICE_MAPPED] == "no-ops: torch.cuda.current_device (0)"


def test_device_cpu_says_nothing_where_nothing_was_mapped(tmp_path, monkeypatch, torch_as_found):
    monkeypatch.setenv(_schema.DEVICE_ENV, "cpu")
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        train(Net())
    torch_as_found.check()
    assert _schema.Key.DEVICE_MAPPED not in header(tmp_path / "t.safetensors")


def test_a_cuda_hard_coded_example_runs_unedited_on_the_cpu(tmp_path):
    """examples/cuda_hardcoded, one process, as ddp-verify starts a leg (sitecustomize)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "python/ddp_verify_trace/autoload"), os.path.join(ROOT, "python")]),
        "DDP_VERIFY_TRACE": str(tmp_path / "t.safetensors"),
        "DDP_VERIFY_LEG": "accumulation",
        "DDP_VERIFY_ACC_STEPS": "2",
        _schema.DEVICE_ENV: "cpu",
        _schema.NO_DROPOUT_ENV: "1",
    }
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    script = os.path.join(ROOT, "examples/cuda_hardcoded/train.py")
    out = subprocess.run(
        [sys.executable, script, "--grad-accum", "2", "--steps", "2", "--dtype", "float32", "--dropout", "0.1"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    meta = header(tmp_path / "t.safetensors")
    assert meta["steps"] == "2" and _schema.Key.DROPOUT not in meta
    assert "5 dropout layers, p up to 0.1" in meta[_schema.Key.DROPOUT_OFF]
    assert "scaled_dot_product_attention dropout_p up to 0.1" in meta[_schema.Key.DROPOUT_OFF]
    assert "cuda -> cpu: Module.to" in meta[_schema.Key.DEVICE_MAPPED]
    assert "autocast(cuda, float32) -> off" in meta[_schema.Key.DEVICE_MAPPED]
