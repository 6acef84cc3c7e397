"""Sampled traces (format 2): of each parameter of more than N elements, N positions that
depend on its name and shape alone; there the gradients, magnitudes, final weights and peaks
of a whole trace of the same run, bit for bit; per step the whole gradient's float64 sum, sum
of squares and max |g|; small tensors and buffers whole; "auto" by the model's size;
DDP_VERIFY_SAMPLE; a size that does not grow with the model's width; DDP with gloo."""
import contextlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from safetensors import safe_open
from test_arguments import one_line
from test_schema import check_trace

import ddp_verify_trace
from _world import run_world
from ddp_verify_trace import TraceRecorder, _schema, _stream
from ddp_verify_trace._positions import Summaries, sample_positions
from ddp_verify_trace.recorder import Recorder


class Net(nn.Module):
    """fc.weight (1200) and out.weight (150) are sampled at N=64; fc.bias (30), the norm's
    weight and bias (30) and out.bias (5) stay whole, as do its buffers."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(40, 30)
        self.bn = nn.BatchNorm1d(30)
        self.out = nn.Linear(30, 5)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(x)))).square().mean()


SAMPLED = {"fc.weight": (30, 40), "out.weight": (5, 30)}
WHOLE = ["fc.bias", "bn.weight", "bn.bias", "out.bias"]


def load(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def train(model, steps=3, acc=2, rec=None, ddp=False, seed=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for i in range(acc):
            x = torch.randn(6, 40, generator=g, dtype=next(model.parameters()).dtype)
            sync = not ddp or i == acc - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                (model(x) / acc).backward()
        if rec is not None:
            rec.step()
        opt.step()
        opt.zero_grad()


def recorded(path, dtype=torch.float32, hook=False, steps=3, **kwargs):
    """One seeded run recorded to `path` by hand (TraceRecorder) or by record()'s hooks."""
    torch.manual_seed(0)
    model = Net().to(dtype)
    if hook:
        with ddp_verify_trace.recording(path, **kwargs):
            train(model, steps=steps)
    else:
        rec = TraceRecorder(model, path, **kwargs)
        train(model, steps=steps, rec=rec)
        rec.close()
    return load(path)


def reference(g):
    """[sum, sum of squares, max |g|] of the whole tensor, in float64, computed apart."""
    d = g.double().reshape(-1)
    return torch.stack([d.sum(), (d * d).sum(), d.abs().max()])


def assert_summary(got, g):
    want = reference(g)
    scale = g.double().abs().sum()
    assert abs(got[0] - want[0]) <= 1e-12 * scale, (got, want)
    assert abs(got[1] - want[1]) <= 1e-12 * want[1], (got, want)
    assert got[2] == want[2], (got, want)


def test_a_sampled_trace_holds_exactly_the_tensors_of_format_2(tmp_path):
    t, meta = recorded(tmp_path / "s.safetensors", sample=64, magnitudes="element", acc_steps=2)
    want = {f"{k}.{s}.{n}" for k in ("grads", "scale") for s in range(3) for n in [*SAMPLED, *WHOLE]}
    want |= {f"summary.{s}.{n}" for s in range(3) for n in SAMPLED}
    want |= {f"{k}.{n}" for k in ("final", "peak") for n in [*SAMPLED, *WHOLE]}
    want |= {f"{k}.{n}" for k in ("positions", "shape", "final_summary") for n in SAMPLED}
    want |= {f"buffer.bn.{b}" for b in ("running_mean", "running_var", "num_batches_tracked")}
    want |= {f"{k}.{s}" for k in ("micro", "clips") for s in range(3)}
    want |= {f"seconds.{s}" for s in range(1, 3)}
    want |= {f"{k}.{s}" for k in ("batches", "samples") for s in range(3)}  # one process: no local sums (the applied gradients stand in)
    assert set(t) == want
    for n, shape in SAMPLED.items():
        pos = t[f"positions.{n}"]
        assert pos.dtype == torch.int64 and pos.shape == (64,)
        assert (pos[1:] > pos[:-1]).all() and 0 <= pos[0] and pos[-1] < shape[0] * shape[1]
        assert t[f"shape.{n}"].tolist() == list(shape) and t[f"shape.{n}"].dtype == torch.int64
        for k in ["final", "peak"] + [f"{k}.{s}" for k in ("grads", "scale") for s in range(3)]:
            assert t[f"{k}.{n}"].shape == (64,) and t[f"{k}.{n}"].dtype == torch.float32, k
        for k in [f"summary.{s}" for s in range(3)] + ["final_summary"]:
            assert t[f"{k}.{n}"].shape == (3,) and t[f"{k}.{n}"].dtype == torch.float64, k
    assert t["final.fc.bias"].shape == (30,) and t["grads.2.out.bias"].shape == (5,)
    assert meta["format"] == _schema.FORMAT == "ddp-verify-trace/2"
    assert meta["sample"] == "64" and meta["magnitudes"] == "true"
    assert meta["parameters"] == str(sum(p.numel() for p in Net().parameters()))
    check_trace(tmp_path / "s.safetensors")


@pytest.mark.parametrize("hook", [False, True], ids=["TraceRecorder", "record"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_samples_are_the_whole_traces_elements_and_summaries_its_sums(tmp_path, hook, dtype):
    whole, wmeta = recorded(tmp_path / "w.safetensors", dtype, hook, magnitudes="element", sample="full")
    part, meta = recorded(tmp_path / "s.safetensors", dtype, hook, magnitudes="element", sample=64)
    assert "sample" not in wmeta and meta["sample"] == "64" and wmeta["parameters"] == meta["parameters"]
    for n in SAMPLED:
        pos = part[f"positions.{n}"]
        for s in range(3):
            g = whole[f"grads.{s}.{n}"]
            assert torch.equal(part[f"grads.{s}.{n}"], g.reshape(-1)[pos]), (s, n)
            assert torch.equal(part[f"scale.{s}.{n}"], whole[f"scale.{s}.{n}"].reshape(-1)[pos]), (s, n)
            assert_summary(part[f"summary.{s}.{n}"], g)
        for k in ("final", "peak"):
            assert torch.equal(part[f"{k}.{n}"], whole[f"{k}.{n}"].reshape(-1)[pos]), (k, n)
        assert_summary(part[f"final_summary.{n}"], whole[f"final.{n}"])
    # Everything else is the whole trace's, tensor for tensor.
    rest = [k for k in whole if not any(k.endswith("." + n) for n in SAMPLED) and not k.startswith("seconds.")]
    same = lambda x, y: torch.equal(x, y) or torch.allclose(x, y, rtol=0, atol=0, equal_nan=True)  # noqa: E731
    assert rest and all(same(whole[k], part[k]) for k in rest)


def test_per_tensor_magnitudes_become_per_element_at_the_positions(tmp_path):
    # record()'s default, "tensor": the first step's backwards ran before the model was known,
    # each kept as its largest |g|: their sum, spread over the positions (an upper bound of
    # each element's sum). From then on the recorder's own hooks sum per element there.
    per_tensor, _ = recorded(tmp_path / "t.safetensors", hook=True, magnitudes="tensor", sample="full")
    per_element, _ = recorded(tmp_path / "e.safetensors", hook=True, magnitudes="element", sample="full")
    part, meta = recorded(tmp_path / "s.safetensors", hook=True, magnitudes="tensor", sample=64)
    assert meta["magnitudes"] == "true"
    for n in [*SAMPLED, *WHOLE]:
        pos = part.get(f"positions.{n}")
        first = part[f"scale.0.{n}"]
        assert first.numel() == (64 if pos is not None else dict(Net().named_parameters())[n].numel())
        assert (first == per_tensor[f"scale.0.{n}"]).all(), n
        at = (lambda x: x.reshape(-1)[pos]) if pos is not None else (lambda x: x)
        assert (first >= at(per_element[f"scale.0.{n}"])).all()
        for s in (1, 2):
            assert torch.equal(part[f"scale.{s}.{n}"], at(per_element[f"scale.{s}.{n}"])), (s, n)
    # TraceRecorder's hooks know the positions from the start: per element at every step.
    hand, meta = recorded(tmp_path / "h.safetensors", magnitudes="tensor", sample=64)
    assert meta["magnitudes"] == "true" and hand["scale.0.fc.weight"].shape == (64,)
    whole_e, _ = recorded(tmp_path / "he.safetensors", magnitudes="element", sample="full")
    assert torch.equal(hand["scale.0.fc.weight"], whole_e["scale.0.fc.weight"].reshape(-1)[hand["positions.fc.weight"]])
    off, meta = recorded(tmp_path / "o.safetensors", magnitudes=False, sample=64)
    assert meta["magnitudes"] == "false" and not [k for k in off if k.startswith("scale.")]
    assert "summary.0.fc.weight" in off


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(8 * 6 * 6, 1)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1)).square().mean()


@pytest.mark.parametrize("hook", [False, True], ids=["TraceRecorder", "record"])
def test_channels_last_gradients_are_sampled_at_the_same_elements(tmp_path, hook):
    # A channels_last weight's gradient is not contiguous: its elements are read where they lie.
    def run(path, sample):
        torch.manual_seed(0)
        model = Conv().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(2)
        ctx = ddp_verify_trace.recording(path, magnitudes="element", sample=sample) if hook else contextlib.nullcontext()
        rec = None if hook else TraceRecorder(model, path, magnitudes="element", sample=sample)
        with ctx:
            for _ in range(2):
                for _ in range(2):
                    x = torch.randn(2, 3, 8, 8, generator=g).to(memory_format=torch.channels_last)
                    model(x).backward()
                assert not model.conv.weight.grad.is_contiguous()
                if rec is not None:
                    rec.step()
                opt.step()
                opt.zero_grad()
        if rec is not None:
            rec.close()
        return load(path)[0]

    whole, part = run(tmp_path / "w.safetensors", "full"), run(tmp_path / "s.safetensors", 50)
    pos = part["positions.conv.weight"]
    for s in range(2):
        for k in ("grads", "scale"):
            assert torch.equal(part[f"{k}.{s}.conv.weight"], whole[f"{k}.{s}.conv.weight"].reshape(-1)[pos]), (k, s)
        assert_summary(part[f"summary.{s}.conv.weight"], whole[f"grads.{s}.conv.weight"])


def test_elements_are_read_in_place_whatever_the_strides(tmp_path):
    lin = nn.Linear(50, 40)
    rec = Recorder(lin, tmp_path / "t.safetensors", sample=64)
    try:
        pos = rec._sampling.positions["weight"]
        base = torch.randn(50, 100)
        for t in (
            torch.randn(40, 50),
            base[:, ::2].t(),  # transposed and strided
            torch.randn(1, 50).expand(40, 50),  # stride 0: a broadcast gradient
            base.t()[10:50, :],  # offset into its storage
        ):
            assert torch.equal(rec._sampling.take("weight", t), t.reshape(-1)[pos])
            assert_summary(Summaries()(t), t)
    finally:
        rec.finish("done")


def test_summaries_are_float64_sums_over_chunks_and_nan_propagates():
    g = torch.Generator().manual_seed(3)
    big = torch.randn(3 * (1 << 18) + 5, generator=g) * 1e3
    summaries = Summaries()
    assert_summary(summaries(big), big)
    assert_summary(summaries(big[:100].to(torch.bfloat16)), big[:100].to(torch.bfloat16))
    out = torch.empty(2, 3, dtype=torch.float64)
    strided = big[:-5].view(-1, 6)[:, :4]  # not contiguous, nor a permutation of it: copied
    summaries(strided, out[1])  # into a row
    assert_summary(out[1], strided)
    for where in (7, big.numel() - 1):
        bad = big.clone()
        bad[where] = float("nan")
        assert summaries(bad).isnan().all(), where
    inf = big.clone()
    inf[1] = float("inf")
    assert summaries(inf)[1:].isinf().all()


def _positions_text():
    cases = [
        ("fc.weight", (30, 40), 64),
        ("layers.3.mlp.w", (50_000, 20_000), 1024),
        ("near.full", (65,), 64),
        ("most", (100,), 70),
    ]
    return repr([sample_positions(*c).tolist() for c in cases])


def test_positions_depend_on_the_name_and_shape_alone(tmp_path):
    here = _positions_text()
    code = "import sys; sys.path.insert(0, %r); import test_sampled; print(test_sampled._positions_text())"
    out = subprocess.run(
        [sys.executable, "-c", code % os.path.dirname(__file__)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == here  # another process, another torch seed
    # Python's random.random() sequence, not torch's generators: the same under any torch
    # version (torch.randint's draws differ between 2.5 and 2.13). Pinned: a change here
    # makes every trace recorded before it incomparable with those after.
    assert sample_positions("fc.weight", (30, 40), 64)[:6].tolist() == [11, 27, 49, 50, 53, 70]
    assert sample_positions("layers.3.mlp.w", (50_000, 20_000), 1024)[:3].tolist() == [382893, 1190633, 1321661]
    most = sample_positions("most", (100,), 70)
    assert most.numel() == 70 and (most[1:] > most[:-1]).all() and most[-1] < 100
    huge = sample_positions("layers.3.mlp.w", (50_000, 20_000), 1024)
    assert huge.numel() == 1024 and (huge[1:] > huge[:-1]).all() and huge[-1] < 10**9
    assert huge[-1] > 9 * 10**8 and huge[0] < 10**8  # spread over the tensor, not its smallest draws
    assert sample_positions("near.full", (65,), 64).numel() == 64
    assert not torch.equal(sample_positions("a", (30, 40), 64), sample_positions("b", (30, 40), 64))
    assert not torch.equal(sample_positions("a", (30, 40), 64), sample_positions("a", (40, 30), 64))
    # Two models of other values (other seeds, other data) keep the same positions.
    a, _ = recorded(tmp_path / "a.safetensors", sample=64)
    torch.manual_seed(5)
    model = Net()
    with TraceRecorder(model, tmp_path / "b.safetensors", sample=64) as rec:
        train(model, steps=1, rec=rec, seed=9)
    b, _ = load(tmp_path / "b.safetensors")
    assert not torch.equal(a["final.fc.weight"], b["final.fc.weight"])
    for n in SAMPLED:
        assert torch.equal(a[f"positions.{n}"], b[f"positions.{n}"])
        assert torch.equal(a[f"positions.{n}"], sample_positions(n, SAMPLED[n], 64))


@pytest.mark.parametrize("hook", [False, True], ids=["TraceRecorder", "record"])
def test_auto_samples_a_model_larger_than_the_schemas_bound(tmp_path, monkeypatch, hook):
    size = sum(p.numel() for p in Net().parameters())
    monkeypatch.setattr(_schema, "SAMPLE_SIZE", 160)
    monkeypatch.setattr(_schema, "SAMPLE_FROM_PARAMETERS", size - 1)
    t, meta = recorded(tmp_path / "big.safetensors", hook=hook)
    assert meta["sample"] == "160" and t["grads.0.fc.weight"].shape == (160,) and t["grads.0.out.weight"].shape == (5, 30)
    # N at least every tensor's size: nothing to sample, a whole trace.
    t, meta = recorded(tmp_path / "n.safetensors", hook=hook, sample=1200, magnitudes="tensor")
    assert "sample" not in meta and meta["magnitudes"] == "per tensor" and t["grads.0.fc.weight"].shape == (30, 40)
    monkeypatch.setattr(_schema, "SAMPLE_FROM_PARAMETERS", size)
    t, meta = recorded(tmp_path / "small.safetensors", hook=hook, sample="auto")
    assert "sample" not in meta and t["grads.0.fc.weight"].shape == (30, 40) and meta["parameters"] == str(size)


@pytest.mark.parametrize("value, sample", [("16", "16"), (" 16 ", "16"), ("full", None), ("Auto", None), ("", None)])
def test_DDP_VERIFY_SAMPLE_sets_the_default(tmp_path, monkeypatch, value, sample):
    monkeypatch.setenv("DDP_VERIFY_SAMPLE", value)
    for hook in (False, True):
        path = tmp_path / f"{hook}.safetensors"
        t, meta = recorded(path, hook=hook, steps=1)
        assert meta.get("sample") == sample
        assert t["grads.0.fc.weight"].shape == ((int(sample),) if sample else (30, 40))
    # An argument wins over the environment.
    t, meta = recorded(tmp_path / "arg.safetensors", hook=True, steps=1, sample=8)
    assert meta["sample"] == "8"


@pytest.mark.parametrize("value", ["0", "-3", "half", "1.5", "true", "1e3"])
def test_a_bad_DDP_VERIFY_SAMPLE_is_refused_at_the_call(tmp_path, monkeypatch, torch_as_found, value):
    monkeypatch.setenv("DDP_VERIFY_SAMPLE", value)
    for make in (
        lambda: ddp_verify_trace.record(tmp_path / "t.safetensors"),
        lambda: TraceRecorder(Net(), tmp_path / "t.safetensors"),
        lambda: ddp_verify_trace.DDPVerifyCallback(tmp_path / "t.safetensors"),
    ):
        with pytest.raises(ValueError) as e:
            make()
        one_line(e, f"DDP_VERIFY_SAMPLE={value!r}", "auto", "full", "unset it")
    torch_as_found.check()


@pytest.mark.parametrize("value", [0, -1, True, False, 1.5, "half", "1024", "Full"])
def test_a_bad_sample_is_refused_at_the_call(tmp_path, torch_as_found, value):
    for make in (
        lambda: ddp_verify_trace.record(tmp_path / "t.safetensors", sample=value),
        lambda: TraceRecorder(Net(), tmp_path / "t.safetensors", sample=value),
        lambda: ddp_verify_trace.DDPVerifyCallback(tmp_path / "t.safetensors", sample=value),
        lambda: ddp_verify_trace.DDPVerifyLightningCallback(tmp_path / "t.safetensors", sample=value),
    ):
        with pytest.raises(ValueError) as e:
            make()
        one_line(e, "sample must be", repr(value), "'auto'")
    torch_as_found.check()


def test_the_callbacks_pass_sample_through(tmp_path, monkeypatch):
    for callback in (ddp_verify_trace.DDPVerifyCallback, ddp_verify_trace.DDPVerifyLightningCallback):
        assert callback(tmp_path / "t.safetensors", sample=8)._session._kw["sample"] == 8
        assert callback(tmp_path / "t.safetensors")._session._kw["sample"] == "auto"
        monkeypatch.setenv("DDP_VERIFY_SAMPLE", "full")
        assert callback(tmp_path / "t.safetensors")._session._kw["sample"] is None
        monkeypatch.delenv("DDP_VERIFY_SAMPLE")


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(400, 300)
        self.b = nn.Linear(300, 400)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))).square().mean()


def test_a_sampled_trace_is_bounded_by_n_per_tensor_per_step(tmp_path):
    def run(path, sample, steps=3):
        torch.manual_seed(0)
        model = Wide()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1)
        with ddp_verify_trace.recording(path, sample=sample, magnitudes="element"):
            for _ in range(steps):
                model(torch.randn(4, 400, generator=g)).backward()
                opt.step()
                opt.zero_grad()
        return os.path.getsize(path)

    whole, part = run(tmp_path / "w.safetensors", "full"), run(tmp_path / "s.safetensors", 64)
    # 4 tensors x (3 steps x (gradient + magnitudes) + final + peak) x 64 float32, 3 float64 per
    # tensor per step and at the end, positions and shapes; the rest is the header's room.
    elements = 4 * (3 * 2 + 2) * 64 * 4 + 4 * 4 * 3 * 8 + 4 * (64 + 2) * 8
    assert part <= _stream.RESERVED + elements + 4096, part
    assert whole > 240_000 * 4 * 8 and part < whole / 20, (part, whole)


def _ddp_worker(rank, world, tmp):
    """The same DDP run three times: whole, sampled by hand, sampled by record()."""
    for name, sample, hook in (("whole", "full", False), ("part", 64, False), ("hook", 64, True)):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(Net())
        path = os.path.join(tmp, f"{name}.safetensors")
        if hook:
            with ddp_verify_trace.recording(path, sample=sample, magnitudes="element"):
                train(model, ddp=True, seed=10 + rank)
        else:
            rec = TraceRecorder(model, path, sample=sample, magnitudes="element")
            train(model, rec=rec, ddp=True, seed=10 + rank)
            rec.close()


def test_ddp_two_processes_sampled(tmp_path):
    run_world(_ddp_worker, 2, str(tmp_path))
    whole, _ = load(tmp_path / "whole.safetensors")
    for name in ("part", "hook"):
        kinds, meta = check_trace(tmp_path / f"{name}.safetensors")
        part, _ = load(tmp_path / f"{name}.safetensors")
        assert meta["run"] == "ddp" and meta["world_size"] == "2" and meta["sample"] == "64"
        assert {"rank_bits", "summary", "positions"} <= kinds
        for n in SAMPLED:
            pos = part[f"positions.{n}"]
            for s in range(3):
                g = whole[f"grads.{s}.{n}"]
                assert torch.equal(part[f"grads.{s}.{n}"], g.reshape(-1)[pos]), (name, s, n)
                # Each rank's per-position magnitudes, averaged over ranks as the whole ones are.
                assert torch.equal(part[f"scale.{s}.{n}"], whole[f"scale.{s}.{n}"].reshape(-1)[pos]), (name, s, n)
                assert_summary(part[f"summary.{s}.{n}"], g)
                # The ranks' checksums of the whole gradients, as in a whole trace.
                assert torch.equal(part[f"rank_bits.{s}.{n}"], whole[f"rank_bits.{s}.{n}"])
            assert torch.equal(part[f"final.{n}"], whole[f"final.{n}"].reshape(-1)[pos])
