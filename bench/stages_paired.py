"""What the stage facts cost per recorded step, measured in turns inside one process per rank:
the recorder without them (`python/` at `--base`) and with them (this checkout's, or
`--stages-python`), each loaded under its own module name, take turns recording the same
training every few steps, with turns of no recorder between. bench/stages.py times whole runs
of each, a minute apart; on a shared 2-core machine their speed drifts more between runs than
the cost measured, and turns a fraction of a second apart see the same machine.

  .venv/bin/python bench/stages_paired.py [--base REV | --base-python DIR] [--stages-python DIR]
                                          [--strip] [--cases nanogpt-1,nanogpt-ddp,fsdp2-tiny]
                                          [--turns N] [--steps N]

Cases (as bench/stages.py's, each rank a loop of its own around the same model):
- nanogpt-1: examples/nanogpt's GPT, one process, K=4 micro-batches of 2 per step, AdamW;
- nanogpt-ddp: the same under DDP over 2 ranks (torchrun, gloo), K/W=2 per rank, the first
  micro-batch under `require_backward_grad_sync = False` as nanoGPT does;
- fsdp2-tiny: bench/fsdp2.py's model under FSDP2 over 2 ranks (gloo), K/W=2, AdamW.
Each turn opens a `record()` session (one line in a script, the same session the zero-edit
recording opens), trains `--steps` + 1 optimizer steps, and closes it. The steps are timed
from one step's end to the next on rank 0, leaving out the turn's first step (it finds the
model and builds the recorder); a turn's median step is its number. Turns go none, base,
stages and back (stages, base, none) so that a drift falls on each alike; the ratio is taken
within each pass, and its median over passes is quoted with the middle half's range. Wall
time, the training thread's CPU time (`cpu`) and the process's (`proc`). Last line: JSON.

`--strip`: the base is the same recorder with its stage facts switched off (`STRIP`), so the
ratio is their own share, apart from what the rest of the recorder gained since the base."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, ".venv", "bin", "python")
TORCHRUN = os.path.join(ROOT, ".venv", "bin", "torchrun")
sys.path.insert(0, HERE)
from stages import BASE, CLOCKS, CONFIGS, has_stage_facts, print_table, unpack_base  # noqa: E402  (the same base recorder and table)

# One rank's loop: argv = case, base dir, stages dir, turns, steps, out, traces dir.
WORKER = r'''
import importlib.util, json, os, statistics, sys, time
import torch, torch.distributed as dist, torch.nn as nn

case, dirs, turns, steps, out, traces = sys.argv[1], sys.argv[2:4], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]

def load(name, root):
    pkg = os.path.join(root, "ddp_verify_trace")
    spec = importlib.util.spec_from_file_location(name, os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

recorders = {"base": load("ddp_verify_trace_base", dirs[0]), "stages": load("ddp_verify_trace_stages", dirs[1])}
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo")
rank = dist.get_rank() if world > 1 else 0
torch.manual_seed(0)
g = torch.Generator().manual_seed(rank)
if case.startswith("nanogpt"):
    sys.path.insert(0, os.path.join(sys.argv[8], "examples", "nanogpt"))
    sys.modules.setdefault("ddp_verify_trace", recorders["stages"])  # train.py imports its sampler
    from train import GPT
    model = GPT()
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    local = 4 // world
    def micro(i):
        if world > 1:
            model.require_backward_grad_sync = i == local - 1
        x = torch.randint(0, 64, (2, 17), generator=g)
        return model(x[:, :-1].contiguous(), x[:, 1:].contiguous()) / local
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
else:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up, self.down = nn.Linear(d, d), nn.Linear(d, d)
        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))
    model = nn.Sequential(*[Block(32) for _ in range(3)])
    mesh = init_device_mesh("cpu", (world,))
    for b in model:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = 2
    def micro(i):
        model.set_requires_gradient_sync(i == local - 1)
        return model(torch.randn(2, 32, generator=g)).square().mean() / local
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

def turn(config):
    session = None
    if config != "none":
        session = recorders[config].record(os.path.join(traces, config + ".safetensors"), overwrite=True)
    ends = []
    for _ in range(steps + 1):
        for i in range(local):
            micro(i).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append((time.perf_counter(), time.thread_time(), time.process_time()))
    if session is not None:
        session.close()
    return [statistics.median(b[c] - a[c] for a, b in zip(ends, ends[1:])) for c in range(3)]

got = {c: [] for c in ("none", "base", "stages")}
order = ["none", "base", "stages"]
turn("stages"); turn("base")  # warm both recorders' first session
for t in range(turns):
    for c in (order if t % 2 == 0 else order[::-1]):
        got[c].append(turn(c))
if rank == 0:
    mods = {k: m.__file__ for k, m in recorders.items()}
    json.dump({"turns": got, "recorders": mods}, open(out, "w"))
if world > 1:
    del model, opt
    dist.destroy_process_group()
'''


def quartiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2]}


def run_case(case: str, args: argparse.Namespace, dirs: list[str], tmp: str) -> dict:
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    out = os.path.join(tmp, f"{case}.json")
    traces = os.path.join(tmp, "traces")
    os.makedirs(traces, exist_ok=True)
    launch = [PY] if case == "nanogpt-1" else [TORCHRUN, "--standalone", "--nproc_per_node=2"]
    cmd = launch + [worker, case, *dirs, str(args.turns), str(args.steps), out, traces, ROOT]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDP_VERIFY_")}
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    p = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0 or not os.path.exists(out):
        sys.exit(f"{case}: the worker failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    got = json.load(open(out))
    for name, path in got["recorders"].items():
        want = dirs[0] if name == "base" else dirs[1]
        if not os.path.abspath(path).startswith(os.path.abspath(want) + os.sep):
            sys.exit(f"{case}: the {name} recorder came from {path}, not {want}")
    turns = got["turns"]
    row: dict = {"turns": len(turns["none"]), "steps_per_turn": args.steps}
    for i, clock in enumerate(CLOCKS):
        per = {c: [t[i] for t in turns[c]] for c in CONFIGS}
        row[clock] = {c: {"median": statistics.median(per[c])} for c in CONFIGS}
        row[clock]["stages/base"] = quartiles([s / b for s, b in zip(per["stages"], per["base"])])
        row[clock]["base/none"] = quartiles([b / n for b, n in zip(per["base"], per["none"])])
    return row


# What `--strip` switches off in a copy of the recorder: the stage facts' patches (outermost
# calls, backward roots, zero_grad: `_patch_stages` returns before it patches) and the local
# sums; the rest records as it does. (Until the recorder's modules were renamed, the first line
# matched was _patch_all's own, which switched off every patch of torch, not these alone.)
STRIP = [
    ("_torch_patches.py", "    call = torch.nn.Module.__call__\n", "    return\n"),
    ("_stages/local_sums.py", "        # Called for every parameter of every backward: as few operations as can be.\n", "        return\n"),
]


def strip_stages(python: str, into: str) -> str:
    """A copy of `python` (a recorder's python/ folder) without its stage facts; its path."""
    shutil.copytree(python, into)
    for name, line, insert in STRIP:
        path = os.path.join(into, "ddp_verify_trace", name)
        text = open(path).read()
        if text.count(line) != 1:
            sys.exit(f"--strip: {name} does not have the line it switches off at once: update STRIP")
        open(path, "w").write(text.replace(line, insert + line, 1))
    return into


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default=BASE, help="the commit whose python/ has no stage facts")
    p.add_argument("--base-python", default=None, help="an older checkout's python/ instead of --base")
    p.add_argument("--stages-python", default=os.path.join(ROOT, "python"), help="the python/ with stage facts")
    p.add_argument("--strip", action="store_true",
                   help="the base: the --stages-python recorder with its stage facts switched off (their own share)")
    p.add_argument("--cases", default="nanogpt-1,nanogpt-ddp,fsdp2-tiny")
    p.add_argument("--turns", type=int, default=30, help="passes of none, base, stages")
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps per turn")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stages-paired-") as tmp:
        if args.strip:
            base = strip_stages(args.stages_python, os.path.join(tmp, "stripped"))
            args.base = "the same recorder without its stage facts"
        else:
            base = os.path.abspath(args.base_python) if args.base_python else unpack_base(args.base, os.path.join(tmp, "base"))
        if not args.strip and has_stage_facts(base):
            sys.exit(f"{base} has the stage facts (ddp_verify_trace/_stages/): give an older --base")
        dirs = [base, os.path.abspath(args.stages_python)]
        print(f"stage facts' cost per recorded step, in turns: {dirs[1]} against {args.base_python or args.base}")
        print("per turn: rank 0's median seconds per optimizer step; ratios within a pass, median over")
        print("passes [middle half]; stages/base is the 5% target's")
        results = {}
        for case in args.cases.split(","):
            results[case] = run_case(case, args, dirs, tmp)
            print(f"  {case}: {results[case]['turns']} passes ({time.perf_counter() - started:.0f} s)", flush=True)
        print_table(results, ("q1", "q3"))
        print(f"({time.perf_counter() - started:.0f} s)")
        print(json.dumps({"base": args.base_python or args.base, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
