"""Two traces of a 100M-parameter loop, for timing `ddp-verify compare` at the size people train.

  .venv/bin/python bench/big_trace.py OUT_DIR [--steps N]

Six Linear(4096, 4096) layers (100.7M parameters), batch 4, K=4 micro-batches per step, SGD,
recorded with `ddp_verify_trace.record()`: OUT_DIR/a.safetensors adds each step's micro-batches
in order, OUT_DIR/b.safetensors in reverse order (four terms added in another order round
otherwise, as under DDP), so gradient elements differ by rounding and `compare` takes its slow path.
Each trace holds N steps' gradients, the final weights and their peaks (about 0.4 GB a step
plus 0.8 GB). bench/compare_big.sh times `compare` on them and reads its peak memory.
"""
import argparse
import os

import torch
import torch.nn as nn

import ddp_verify_trace


def run(path, steps, reverse):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(6)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 4096, generator=g) for _ in range(4 * steps)]
    session = ddp_verify_trace.record(path, overwrite=True, acc_steps=4)
    for s in range(steps):
        micro = batches[4 * s : 4 * s + 4]
        for x in reversed(micro) if reverse else micro:
            (model(x).square().mean() / 4).backward()
        opt.step()
        opt.zero_grad()
    session.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=1)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, reverse in (("a", False), ("b", True)):
        run(os.path.join(args.out, f"{name}.safetensors"), args.steps, reverse)


if __name__ == "__main__":
    main()
