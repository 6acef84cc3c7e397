"""A recording leaves torch and Python as it found them: every patch in the registry
(`_patches`), sys.excepthook and the exit handlers are the very objects they were once it
closes, is abandoned or the script exits; a sampler's set_epoch alone patches nothing;
sessions follow one another."""
import gc
import json
import os
import subprocess
import sys
import weakref

import pytest
import torch
from safetensors import safe_open
from torch.utils.data import DistributedSampler
from conftest import label
from test_hook import loop, make

import ddp_verify_trace
from ddp_verify_trace import AccumulationBatchSampler, TraceRecorder, _patches


def train_with_everything(model, opt, steps=2):
    """Clipping, a DistributedSampler's and an AccumulationBatchSampler's epochs, a GradScaler."""
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    sampler = DistributedSampler(list(range(8)), num_replicas=2, rank=0)
    batches = AccumulationBatchSampler(8, world=2, batch_size=2)
    for epoch in range(steps):
        sampler.set_epoch(epoch)
        batches.set_epoch(epoch)
        scaler.scale(model(torch.ones(4, 3)).square().mean()).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()


def test_closing_a_session_restores_every_patch_in_the_registry(tmp_path, torch_as_found):
    model, opt = make()
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        train_with_everything(model, opt)
        made = _patches.made()
        # Not vacuous: torch's own 14 patches at least (`_torch_patches`), each in place now or
        # given back by its own undo (Module.__call__'s, at the first step); the exit handler.
        assert len(made) >= 14 and len({(id(p.owner), p.name) for p in made}) == len(made)
        assert [label(p.owner, p.name) for p in made if not (in_place(p) or p.given_back)] == []
        assert torch_as_found.changed() and len(torch_as_found.exit_handlers) == 1
    assert [label(p.owner, p.name) for p in made if getattr(p.owner, p.name) is not p.original] == []
    torch_as_found.check()
    with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
        assert f.metadata()["steps"] == "2" and f.get_tensor("clips.1").item() == 1


@pytest.mark.skipif(not hasattr(torch.nn.utils, "clip_grads_with_norm_"), reason="torch before 2.6")
def test_a_clip_in_two_calls_is_counted_once_with_its_norm(tmp_path):
    # Accelerate 1.16's clip_grad_norm_: the total norm, then the clip with it.
    model, opt = make()
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        for _ in range(2):
            model(torch.ones(4, 3)).square().mean().backward()
            total = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            torch.nn.utils.clip_grads_with_norm_(list(model.parameters()), 0.01, total)
            opt.step()
            opt.zero_grad()
    with safe_open(str(tmp_path / "t.safetensors"), "pt") as f:
        assert f.get_tensor("clips.1").item() == 1
        norm, max_norm = f.get_tensor("clip.1").tolist()
        assert max_norm == pytest.approx(0.01) and norm > 0.01


def in_place(patch):
    return getattr(patch.owner, patch.name) is patch.replacement


def test_every_librarys_patches_are_restored_too(tmp_path):
    """Each module a patch waits for (the registry says which: the engines' and frameworks'
    libraries) imported while a session records, in a process of its own: their patches go
    in, and closing the session takes every one out, and every import finder with it."""
    code = (
        "import importlib, json, os, ddp_verify_trace\n"
        "from ddp_verify_trace import _patches\n"
        "session = ddp_verify_trace.record(os.environ['TRACE'])\n"
        "imported = []\n"
        "for name in dict.fromkeys(_patches.waiting()):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        imported.append(name)\n"
        "    except ImportError:  # a library not installed\n"
        "        pass\n"
        "made = _patches.made()\n"
        "out = {'imported': imported, 'made': [f'{p.owner}.{p.name}' for p in made]}\n"
        "out['out'] = [m for m, p in zip(out['made'], made) if getattr(p.owner, p.name) is not p.replacement]\n"
        "session.close()\n"
        "out['kept'] = [m for m, p in zip(out['made'], made) if getattr(p.owner, p.name) is not p.original]\n"
        "out['left'] = [str(p) for p in _patches.made()] + _patches.waiting()\n"
        "print(json.dumps(out))\n"
    )
    out = run_script(code, TRACE=str(tmp_path / "t.safetensors"))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    # Not vacuous: a library's patches beyond torch's own 14, all in place (no step was taken,
    # so Module.__call__'s too).
    assert got["imported"] and len(got["made"]) > 14 and got["out"] == [], got
    assert got["kept"] == [] and got["left"] == [], got


def test_an_abandoned_session_restores_every_patched_function(tmp_path, torch_as_found):
    model, opt = make()
    with pytest.raises(RuntimeError, match="data loader broke"):
        with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
            train_with_everything(model, opt)
            raise RuntimeError("data loader broke")
    torch_as_found.check()
    assert not list(tmp_path.iterdir())


def test_a_session_closed_before_its_first_step_restores_everything(tmp_path, torch_as_found):
    ddp_verify_trace.record(tmp_path / "t.safetensors").close()
    torch_as_found.check()
    assert not list(tmp_path.iterdir())


def test_a_trace_recorder_restores_the_patches_when_closed_or_abandoned(tmp_path, torch_as_found):
    model, opt = make()
    with TraceRecorder(model, tmp_path / "closed.safetensors", optimizer=opt) as rec:
        assert "torch.nn.utils.clip_grad_norm_" in torch_as_found.changed()
        loop(model, opt, steps=1, rec=rec)
    torch_as_found.check()
    with pytest.raises(ZeroDivisionError):
        with TraceRecorder(model, tmp_path / "abandoned.safetensors", optimizer=opt) as rec:
            loop(model, opt, steps=1, rec=rec)
            1 / 0
    torch_as_found.check()


def test_a_patch_set_over_ours_is_left_in_place(tmp_path):
    original = torch.nn.utils.clip_grad_norm_
    try:
        with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
            underneath = torch.nn.utils.clip_grad_norm_  # ours

            def theirs(*args, **kwargs):
                return underneath(*args, **kwargs)

            torch.nn.utils.clip_grad_norm_ = theirs
        assert torch.nn.utils.clip_grad_norm_ is theirs
        assert torch.nn.utils.clip_grad.clip_grad_norm_ is original  # the name nobody patched over
        # Ours, left under theirs, passes every call through with no recording open.
        model, _ = make()
        model(torch.ones(2, 3)).sum().backward()
        assert float(theirs(model.parameters(), 1e-3)) > 0
        assert torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])) < 2e-3
    finally:
        torch.nn.utils.clip_grad_norm_ = original


def test_setting_an_epoch_alone_patches_nothing(torch_as_found):
    sampler = AccumulationBatchSampler(10, world=2, batch_size=2, shuffle=True)
    sampler.set_epoch(3)
    sampler.sampler.set_epoch(4)
    assert sampler.epoch == 4 and len(list(sampler)) == 6
    torch_as_found.check()


def test_the_epoch_log_stays_small_however_many_epochs(tmp_path):
    model, opt = make()
    sampler = AccumulationBatchSampler(8, world=2, batch_size=2)
    with ddp_verify_trace.recording(tmp_path / "t.safetensors") as session:
        for epoch in range(10_000):
            sampler.set_epoch(epoch)
        assert len(session._watch._epochs) == 2


def epochs_of_two_steps(path, sampler):
    model, opt = make()
    with ddp_verify_trace.recording(path):
        for epoch in range(2):
            sampler.set_epoch(epoch)
            loop(model, opt, steps=2)
    with safe_open(str(path), "pt") as f:
        return f.metadata()["steps_per_epoch"]


def test_each_session_infers_steps_per_epoch_from_its_own_epochs(tmp_path):
    # Earlier, one epoch log outlived its session: the second saw two epochs at its second step.
    sampler = AccumulationBatchSampler(8, world=2, batch_size=2)
    assert epochs_of_two_steps(tmp_path / "first.safetensors", sampler) == "2"
    assert epochs_of_two_steps(tmp_path / "second.safetensors", sampler) == "2"


def test_a_second_record_after_the_first_closed_records(tmp_path, torch_as_found):
    for name in ("first", "second"):
        model, opt = make()
        session = ddp_verify_trace.record(tmp_path / f"{name}.safetensors")
        loop(model, opt, steps=2)
        session.close()
    torch_as_found.check()
    for name in ("first", "second"):
        with safe_open(str(tmp_path / f"{name}.safetensors"), "pt") as f:
            assert f.metadata()["steps"] == "2"


def test_a_second_record_while_the_first_records_is_refused(tmp_path, torch_as_found):
    model, opt = make()
    with ddp_verify_trace.recording(tmp_path / "first.safetensors"):
        loop(model, opt, steps=1)
        with pytest.raises(RuntimeError, match="already recording to .*first.safetensors: close") as e:
            ddp_verify_trace.record(tmp_path / "second.safetensors")
        assert "\n" not in str(e.value)
    torch_as_found.check()


def test_a_session_starts_once(tmp_path):
    with ddp_verify_trace.recording(tmp_path / "t.safetensors") as session:
        with pytest.raises(RuntimeError, match="started before"):
            session.start()


def run_script(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})


def test_the_exit_handler_writes_an_open_sessions_trace_and_restores_torch(tmp_path):
    # Registered before record(), this handler runs after the recorder's (atexit is LIFO).
    code = (
        "import atexit, os, sys, torch, ddp_verify_trace\n"
        "before = (torch.nn.utils.clip_grad_norm_, torch.optim.Optimizer.__init__, sys.excepthook)\n"
        "path = os.environ['TRACE']\n"
        "atexit.register(lambda: print('written' if os.path.exists(path) else 'missing', before == "
        "(torch.nn.utils.clip_grad_norm_, torch.optim.Optimizer.__init__, sys.excepthook)))\n"
        "ddp_verify_trace.record(path)\n"
        "m = torch.nn.Linear(3, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(2):\n    m(torch.ones(2, 3)).sum().backward(); o.step(); o.zero_grad()\n"
    )
    out = run_script(code, TRACE=str(tmp_path / "t.safetensors"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["written", "True"]


def test_a_closed_sessions_exit_handler_is_gone(tmp_path):
    # Closed by hand, then its file removed: nothing at exit writes it again or complains.
    code = (
        "import os, torch, ddp_verify_trace\n"
        "s = ddp_verify_trace.record(os.environ['TRACE'])\n"
        "m = torch.nn.Linear(3, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "m(torch.ones(2, 3)).sum().backward(); o.step()\n"
        "s.close(); os.remove(os.environ['TRACE'])\n"
    )
    out = run_script(code, TRACE=str(tmp_path / "t.safetensors"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert not list(tmp_path.iterdir())


def test_nothing_keeps_a_closed_session_or_its_model(tmp_path):
    model, opt = make()
    session = ddp_verify_trace.record(tmp_path / "t.safetensors")
    loop(model, opt, steps=1)
    session.close()
    gone = [weakref.ref(session), weakref.ref(model)]
    del session, model, opt
    gc.collect()
    assert [r() for r in gone] == [None, None]


def test_several_patches_waiting_for_one_module_all_go_in(tmp_path, monkeypatch):
    (tmp_path / "_waited_for.py").write_text("class A:\n    def f(self):\n        return 1\n\n    def g(self):\n        return 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _patches.made() == []  # no recording open: undo() below takes out these two alone
    try:
        _patches.after_import("_waited_for", lambda m: _patches.replace(m.A, "f", lambda self: 10))
        _patches.after_import("_waited_for", lambda m: _patches.replace(m.A, "g", lambda self: 20))
        import _waited_for

        assert (_waited_for.A().f(), _waited_for.A().g()) == (10, 20)
    finally:
        _patches.undo()
        sys.modules.pop("_waited_for", None)
