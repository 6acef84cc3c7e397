"""Wrong arguments are refused at the call that takes them, in one line naming the argument
and its fix, before anything is patched; not inside the first optimizer step. The zero-edit
hook reports them at start-up and lets the script run. The callbacks' own names."""
import os
import subprocess
import sys

import pytest
import torch.nn as nn
from test_hook import make

import ddp_verify_trace
from ddp_verify_trace import TraceRecorder


def one_line(error, *words):
    text = str(error.value)
    assert "\n" not in text, text
    for word in words:
        assert word in text, (word, text)


def test_record_refuses_an_existing_file_at_the_call(tmp_path, torch_as_found):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"earlier")
    with pytest.raises(FileExistsError) as e:
        ddp_verify_trace.record(path)
    one_line(e, str(path), "overwrite=True")
    torch_as_found.check()
    assert path.read_bytes() == b"earlier"
    ddp_verify_trace.record(path, overwrite=True).close()


@pytest.mark.parametrize("value", ["bogus", "true", "1"])
def test_a_bad_DDP_VERIFY_MAGNITUDES_is_refused_at_the_call(tmp_path, monkeypatch, torch_as_found, value):
    monkeypatch.setenv("DDP_VERIFY_MAGNITUDES", value)
    with pytest.raises(ValueError) as e:
        ddp_verify_trace.record(tmp_path / "t.safetensors")
    one_line(e, f"DDP_VERIFY_MAGNITUDES={value!r}", "element", "unset it")
    torch_as_found.check()


@pytest.mark.parametrize(
    "value, header", [("element", "true"), ("Tensor", "per tensor"), ("false", "false"), ("0", "false"), ("", "per tensor")]
)
def test_DDP_VERIFY_MAGNITUDES_sets_the_default(tmp_path, monkeypatch, value, header):
    from test_hook import load, loop

    monkeypatch.setenv("DDP_VERIFY_MAGNITUDES", value)
    model, opt = make()
    with ddp_verify_trace.recording(tmp_path / "t.safetensors"):
        loop(model, opt, steps=1)
    assert load(tmp_path / "t.safetensors")[1]["magnitudes"] == header


def test_a_bad_magnitudes_is_refused_at_the_call(tmp_path, torch_as_found):
    for make_it in (
        lambda: ddp_verify_trace.record(tmp_path / "t.safetensors", magnitudes="elements"),
        lambda: TraceRecorder(make()[0], tmp_path / "t.safetensors", magnitudes="elements"),
    ):
        with pytest.raises(ValueError) as e:
            make_it()
        one_line(e, "magnitudes must be", "'elements'")
    torch_as_found.check()


def test_a_path_no_file_can_be_written_at_is_refused_at_the_call(tmp_path, torch_as_found):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    cases = [
        (a_file / "deeper" / "t.safetensors", "which is a file"),
        (tmp_path, "is a folder"),
    ]
    for path, says in cases:
        with pytest.raises(ValueError) as e:
            ddp_verify_trace.record(path)
        one_line(e, str(path), says, "pass a")
        with pytest.raises(ValueError):
            TraceRecorder(make()[0], path)
    torch_as_found.check()


def test_a_folder_that_is_not_writable_is_refused_at_the_call(tmp_path, monkeypatch, torch_as_found):
    locked = tmp_path / "locked"
    locked.mkdir()
    # As os.access answers for a folder this user may not write in (root may write anywhere).
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != str(locked) and access(path, mode))
    with pytest.raises(ValueError) as e:
        ddp_verify_trace.record(locked / "new" / "t.safetensors")
    one_line(e, str(locked), "not writable")
    torch_as_found.check()


def test_a_missing_folder_is_made_at_the_first_step(tmp_path):
    from test_hook import loop

    path = tmp_path / "new" / "dir" / "t.safetensors"
    model, opt = make()
    session = ddp_verify_trace.record(path)
    assert not (tmp_path / "new").exists()  # nothing is written before a step
    loop(model, opt, steps=1)
    session.close()
    assert path.is_file()


def test_the_callbacks_check_their_arguments_when_made(tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"earlier")
    for callback in (ddp_verify_trace.DDPVerifyCallback, ddp_verify_trace.DDPVerifyLightningCallback):
        with pytest.raises(FileExistsError):
            callback(path)
        with pytest.raises(ValueError, match="magnitudes"):
            callback(tmp_path / "u.safetensors", magnitudes="x")


def test_the_callbacks_have_names_of_their_own_and_the_old_names_are_aliases():
    import lightning.pytorch as pl
    import transformers

    from ddp_verify_trace import callbacks

    assert issubclass(ddp_verify_trace.DDPVerifyCallback, transformers.TrainerCallback)
    assert ddp_verify_trace.DDPVerifyCallback is not transformers.TrainerCallback
    assert issubclass(ddp_verify_trace.DDPVerifyLightningCallback, pl.Callback)
    assert ddp_verify_trace.TrainerCallback is ddp_verify_trace.DDPVerifyCallback is callbacks.DDPVerifyCallback
    assert ddp_verify_trace.LightningCallback is ddp_verify_trace.DDPVerifyLightningCallback
    assert {"DDPVerifyCallback", "DDPVerifyLightningCallback", "TrainerCallback", "LightningCallback"} <= set(
        ddp_verify_trace.__all__
    )
    with pytest.raises(AttributeError, match="DistributedSamplerMimic"):
        ddp_verify_trace.DistributedSamplerMimic


def test_the_zero_edit_hook_reports_a_bad_setting_at_start_up_and_the_script_runs(tmp_path):
    autoload = os.path.join(os.path.dirname(ddp_verify_trace.__file__), "autoload")
    package = os.path.dirname(os.path.dirname(ddp_verify_trace.__file__))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([autoload, package]),
        "DDP_VERIFY_TRACE": str(tmp_path / "t.safetensors"),
        "DDP_VERIFY_MAGNITUDES": "bogus",
    }
    code = (
        "import torch\n"
        "m = torch.nn.Linear(3, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "m(torch.ones(2, 3)).sum().backward(); o.step()\n"
        "print('trained')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout == "trained\n", out.stderr
    assert "DDP_VERIFY_MAGNITUDES='bogus'" in out.stderr
    assert not list(tmp_path.iterdir())


def test_a_model_of_mixed_dtypes_is_still_refused_with_its_fix(tmp_path, torch_as_found):
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="model.to"):
        TraceRecorder(mixed, tmp_path / "m.safetensors")
    torch_as_found.check()
