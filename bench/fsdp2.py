"""The recorder's cost on an FSDP2 step: the same loop under torchrun with and without
`ddp_verify_trace.record()`, whole and sampled.

  .venv/bin/python bench/fsdp2.py OUT_DIR [--world 2] [--steps 6] [--sizes tiny,50m]

Each rank `fully_shard`s every block and the root over `init_device_mesh("cpu", (W,))` (gloo),
K/W = 2 micro-batches per step with `set_requires_gradient_sync(last)`, AdamW. Models: `tiny`
(3 blocks of width 32, 26k parameters, batch 2) and `50m` (6 blocks of Linear(2048, 2048) pairs:
50.4M parameters, batch 4). Per configuration (no recorder, whole trace, sampled N=1024) it
prints rank 0's median seconds per step (the first step left out: it warms up) and the ratio
to no recorder; the last line is JSON with every number. The recorder's work per step under
FSDP2: whole traces all-gather each gradient (`full_tensor()`); sampled ones gather the kept
positions each rank owns and its shards' float64 sums (two all-reduces for all tensors).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

RANK_SCRIPT = r'''
import json, os, sys, time
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import ddp_verify_trace

size, steps, path, sample, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo")
world = dist.get_world_size()
width, blocks, batch = (32, 3, 2) if size == "tiny" else (2048, 6, 4)

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, d), nn.Linear(d, d)
    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

torch.manual_seed(0)
model = nn.Sequential(*[Block(width) for _ in range(blocks)])
mesh = init_device_mesh("cpu", (world,))
for b in model:
    fully_shard(b, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
session = None
if path != "-":
    # "full" and "auto" as record() takes them (None would take DDP_VERIFY_SAMPLE, else "auto":
    # sampled above 4M parameters), else N positions.
    session = ddp_verify_trace.record(path, overwrite=True, sample=sample if sample in ("full", "auto") else int(sample))
g = torch.Generator().manual_seed(dist.get_rank())
times = []
for _ in range(steps):
    xs = [torch.randn(batch, width, generator=g) for _ in range(2)]
    t0 = time.perf_counter()
    for i, x in enumerate(xs):
        model.set_requires_gradient_sync(i == len(xs) - 1)
        (model(x).square().mean() / len(xs)).backward()
    opt.step()
    opt.zero_grad()
    dist.barrier()
    times.append(time.perf_counter() - t0)
if session is not None:
    session.close()
if dist.get_rank() == 0:
    json.dump({"times": times, "parameters": sum(p.numel() for p in model.parameters())}, open(out, "w"))
dist.destroy_process_group()
'''


def run(size, steps, world, path, sample, tmp):
    script = os.path.join(tmp, "rank.py")
    with open(script, "w") as f:
        f.write(RANK_SCRIPT)
    out = os.path.join(tmp, "times.json")
    cmd = [os.path.join(ROOT, ".venv/bin/torchrun"), "--standalone", f"--nproc_per_node={world}", script,
           size, str(steps), path, str(sample), out]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    got = json.load(open(out))
    return statistics.median(got["times"][1:]), got["parameters"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--sizes", default="tiny,50m")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            row = {}
            for name, path, sample in [
                ("none", "-", "full"),
                ("whole", os.path.join(args.out, f"{size}-whole.safetensors"), "full"),
                ("sampled", os.path.join(args.out, f"{size}-sampled.safetensors"), 1024),
            ]:
                seconds, params = run(size, args.steps, args.world, path, sample, tmp)
                row[name] = seconds
                row["parameters"] = params
                ratio = seconds / row["none"]
                print(f"{size} ({params} parameters) {name}: {seconds:.4f} s/step ({ratio:.2f}x)", flush=True)
            results[size] = row
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
