"""A user's time to a verdict: `ddp-verify --acc-steps 4 --gpus 2 -- python train.py ARGS` on each
example, as a ratio to one run of the same script under `torchrun --nproc_per_node 2` (what the
user would run anyway); and the recorder's whole-process cost on a 100M-parameter loop.

  .venv/bin/python bench/examples.py [--runs N] [--examples nanogpt,transformers,...] [--skip-100m]

Per example, the two commands in turn, N times (A B A B ...), each timed as a whole process
(wall seconds); the ratio is taken pair by pair and its median quoted with min-max. ddp-verify
runs two legs of the script (accumulation in one process, DDP over 2), or three where ARGS take
{batch} (the big batch), then judges: a ratio near the number of legs means the recording and
the judging cost little beside the training.

The 100M case: bench/sampled.py's loop (6 x Linear(4096, 4096), 100.7M parameters, K=2, SGD)
as one process, 4 steps, with the zero-edit recorder (as `ddp-verify -- python` starts it,
its default sample: 1024 positions per tensor) and without; the same pair-by-pair ratio.
The last line is JSON with every number.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.join(ROOT, ".venv", "bin")
EXE = os.path.join(ROOT, "target", "debug", "ddp-verify")

# Each example's arguments, as tests/it/user_loops.rs runs its honest loop.
EXAMPLES = {
    "nanogpt": "--grad-accum {acc_steps}",
    "transformers": "--grad-accum {local_acc_steps} --batch {batch}",
    "lightning": "--grad-accum {local_acc_steps} --gpus {gpus}",
    "accelerate": "--grad-accum {local_acc_steps}",
}
# What {placeholders} are in the one run under torchrun: the DDP leg's values (K=4, W=2, B=2).
ONE_RUN = {"{acc_steps}": "4", "{local_acc_steps}": "2", "{gpus}": "2", "{batch}": "2", "{world}": "2"}

BIG_LOOP = r'''
import sys, torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(6)])
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(4, 4096)
for step in range(4):
    for _ in range(2):
        (model(x).pow(2).mean() / 2).backward()
    opt.step()
    opt.zero_grad()
'''


def wall(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> float:
    t = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return took


def spread(v: list[float]) -> dict[str, float]:
    return {"median": statistics.median(v), "min": min(v), "max": max(v)}


def pairs(a, b, runs: int) -> dict[str, dict[str, float]]:
    """A and B in turn after one warm-up of each; their seconds and the ratios A/B."""
    a(), b()
    ta, tb = [], []
    for _ in range(runs):
        ta.append(a())
        tb.append(b())
    return {"a": spread(ta), "b": spread(tb), "ratio": spread([x / y for x, y in zip(ta, tb)])}


def example(name: str, runs: int) -> dict[str, dict[str, float]]:
    script = os.path.join(ROOT, "examples", name, "train.py")
    args = EXAMPLES[name].split()
    one = [ONE_RUN.get(a, a) for a in args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def verdict() -> float:
        with tempfile.TemporaryDirectory() as t:
            return wall([EXE, "--acc-steps", "4", "--gpus", "2", "--", os.path.join(BIN, "python"), script, *args], env, t)

    def torchrun() -> float:
        with tempfile.TemporaryDirectory() as t:
            return wall([os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", "2", script, *one], env, t)

    return pairs(verdict, torchrun, runs)


def big(runs: int) -> dict[str, dict[str, float]]:
    python = os.path.join(BIN, "python")
    autoload = os.path.join(ROOT, "python", "ddp_verify_trace", "autoload")
    plain = {**os.environ, "OMP_NUM_THREADS": "1"}

    def recorded() -> float:
        with tempfile.TemporaryDirectory() as t:
            env = {**plain, "PYTHONPATH": os.pathsep.join([autoload, os.path.join(ROOT, "python")]),
                   "DDP_VERIFY_TRACE": os.path.join(t, "t.safetensors"), "DDP_VERIFY_ACC_STEPS": "2"}  # fmt: skip
            return wall([python, "-c", BIG_LOOP], env, t)

    return pairs(recorded, lambda: wall([python, "-c", BIG_LOOP], plain), runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--examples", default=",".join(EXAMPLES))
    p.add_argument("--skip-100m", action="store_true")
    a = p.parse_args()
    if not os.path.exists(EXE):
        sys.exit(f"{EXE}: build it first (cargo build)")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
    print(f"{time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} CPUs; {a.runs} pairs after a warm-up each")
    out: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "runs": a.runs}
    print(f"{'example':<14} {'ddp-verify s':>14} {'torchrun s':>12} {'ratio':>22}")
    for name in a.examples.split(","):
        r = example(name, a.runs)
        out[name] = r
        print(f"{name:<14} {r['a']['median']:>14.1f} {r['b']['median']:>12.1f} "
              f"{r['ratio']['median']:>8.2f} [{r['ratio']['min']:.2f}-{r['ratio']['max']:.2f}]", flush=True)  # fmt: skip
    if not a.skip_100m:
        r = big(a.runs)
        out["recorder-100m"] = r
        print(f"100M loop, one process, 4 steps: recorded {r['a']['median']:.1f} s, plain {r['b']['median']:.1f} s, "
              f"{r['ratio']['median']:.3f} [{r['ratio']['min']:.3f}-{r['ratio']['max']:.3f}]")  # fmt: skip
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
