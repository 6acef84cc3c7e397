"""Two optimizers, as scripts that learn a criterion's own parameters write them: the model
under DDP with AdamW, a learned per-class temperature outside it with SGD of its own, whose
gradients the script all-reduces by hand after the model's step and before its own (DDP
reduces only the model's). One process is a world of one; K in all (`--accum`: micro-batches
per optimizer step in this process), samples dealt contiguously, so both legs see the same.

  ddp-verify --acc-steps 4 --gpus 2 -- torchrun --nproc-per-node 2 tests/optimizers/two.py --accum {local_acc_steps}

`--bug never-reduced`: the temperature's gradients are never all-reduced: each rank steps it
with its own micro-batches' gradient.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--bug", choices=["never-reduced"])
    args = p.parse_args()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))
    temperature = nn.Parameter(torch.ones(4))
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_t = torch.optim.SGD([temperature], lr=0.1)
    g = torch.Generator().manual_seed(5)
    k = args.accum * world
    for step in range(args.steps):
        x = torch.randn(k * 3, 6, generator=g)
        y = torch.randint(0, 4, (k * 3,), generator=g)
        for micro in range(args.accum):
            i = rank * args.accum + micro
            xb, yb = x[3 * i : 3 * i + 3], y[3 * i : 3 * i + 3]
            if world > 1:
                net.require_backward_grad_sync = micro == args.accum - 1
            loss = F.cross_entropy(net(xb) / temperature, yb) / args.accum
            loss.backward()
        opt.step()
        if world > 1 and args.bug != "never-reduced":
            dist.all_reduce(temperature.grad)
            temperature.grad /= world
        opt_t.step()
        opt.zero_grad()
        opt_t.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
