"""The engines and frameworks behind their one interface: the registries hold to the schema's
words, each engine imports and claims nothing without its library, the recording core names
no engine, and a new engine is one module and one registry line (a throwaway one, recorded)."""
import pathlib
import re
import subprocess
import sys

import torch
from safetensors import safe_open

import ddp_verify_trace
from ddp_verify_trace import _schema, engines, frameworks

PACKAGE = pathlib.Path(ddp_verify_trace.__file__).parent
# The recording core: everything but the engines' and frameworks' own folders.
CORE = sorted(
    p for p in PACKAGE.rglob("*.py") if p.name != "_schema.py" and p.relative_to(PACKAGE).parts[0] not in ("engines", "frameworks")
)


def _words(vocabulary):
    return {v for k, v in vars(vocabulary).items() if not k.startswith("_")}


def test_every_engine_and_framework_is_a_schema_word():
    # Ddp's word comes from its forwards, DeepSpeed's from the stage (`_schema.Engine` read there).
    assert {kind.name for kind in engines.ENGINES if kind.name is not None} <= _words(_schema.Engine)
    assert engines.ENGINES[-1] is engines.Ddp  # claims whatever the others leave
    assert {fw.name for fw in frameworks.FRAMEWORKS} | {frameworks.PLAIN} == _words(_schema.Framework)


def test_the_recording_core_names_no_engine():
    pattern = re.compile(r"deepspeed|fsdp|dtensor|sharded|zero[0-3]\b|DistributedDataParallel|_post_forward", re.I)
    found = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in CORE for m in pattern.finditer(p.read_text())]
    assert found == [], found


def test_each_engine_imports_and_claims_nothing_without_its_library():
    """deepspeed unimportable: a plain model's optimizer is DDP's (or one process's), and it
    records as one."""
    code = (
        "import sys; sys.modules['deepspeed'] = None\n"
        "import torch, ddp_verify_trace\n"
        "from ddp_verify_trace import engines\n"
        "from ddp_verify_trace.engines import deepspeed\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1)\n"
        "assert deepspeed.find_zero(opt) is None and deepspeed.engines() == []\n"
        "assert type(engines.find(opt, list(model.parameters()))) is engines.Ddp\n"
        "import tempfile, os\n"
        "with ddp_verify_trace.recording(os.path.join(tempfile.mkdtemp(), 't.safetensors')) as s:\n"
        "    model(torch.ones(2)).sum().backward(); opt.step()\n"
        "    assert type(s.recorder.engine) is engines.Ddp\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_new_engine_is_one_module_and_one_registry_line(tmp_path, monkeypatch, torch_as_found):
    from _throwaway_engine import NAME, Throwaway

    monkeypatch.setattr(engines, "ENGINES", [Throwaway, *engines.ENGINES])  # the registry line
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    for p in model.parameters():
        p.throwaway = True
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    want = []
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        assert hasattr(torch.autograd.backward, "__wrapped__")  # its patch, while recording
        for _ in range(2):
            for j in range(2):
                model(x[2 * j : 2 * j + 2]).pow(2).mean().backward()
            want.append({n: p.grad.clone() / 2 for n, p in model.named_parameters()})
            opt.step()
            opt.zero_grad()
    torch_as_found.check()
    assert getattr(torch.autograd.backward, "__wrapped__", None) is None  # its patch is undone
    with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    assert (meta["engine"], meta["engine_accumulation"], meta["magnitudes"]) == (NAME, "2", "false")
    assert "throwaway" in meta["warnings"]
    for s, grads in enumerate(want):
        assert int(t[f"micro.{s}"]) == 2 and t[f"ddp_sync.{s}"].tolist() == [1, 1]
        for n, g in grads.items():
            assert torch.equal(t[f"grads.{s}.{n}"], g), (s, n)


def test_an_fsdp2_backward_names_the_engine_even_unreduced():
    """A run whose FSDP2 groups never reduce (set_requires_gradient_sync(False) left on) is
    still FSDP2's: the header names the engine, and its flags say none reduced."""
    from types import SimpleNamespace

    from ddp_verify_trace import _watch
    from ddp_verify_trace.engines.fsdp2 import _backward_ended

    watch = _watch.Watch()
    group = SimpleNamespace(gradient_divide_factor=None, mp_policy=None)
    for _ in range(2):
        _backward_ended(watch, group, False)
    assert watch.engine == _schema.Engine.FSDP2 and watch.take_syncs() == [False, False]
    assert watch.take_comm() == (0, 0)
