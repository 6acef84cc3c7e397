"""Rank 0's optimizer steps for ddp-verify's progress line (`_progress.py`): counted into
the file DDP_VERIFY_PROGRESS names, and never in the way of training."""
import os
import subprocess
import sys

LOOP = """
import os, sys, torch, ddp_verify_trace
m = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
with ddp_verify_trace.recording(sys.argv[1]):
    for _ in range(3):
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.zero_grad()
print("trained")
"""


def run(tmp_path, progress):
    env = {**os.environ, "DDP_VERIFY_PROGRESS": str(progress)}
    return subprocess.run(
        [sys.executable, "-c", LOOP, str(tmp_path / "t.safetensors")], env=env, capture_output=True, text=True
    )


def test_the_steps_recorded_are_in_the_file_at_close(tmp_path):
    out = run(tmp_path, tmp_path / "count")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "count").read_text().strip() == "3"


def test_a_file_that_cannot_be_written_leaves_training_and_the_trace_alone(tmp_path):
    out = run(tmp_path, tmp_path)  # a directory
    assert out.returncode == 0 and "trained" in out.stdout, out.stderr
    assert (tmp_path / "t.safetensors").exists()
