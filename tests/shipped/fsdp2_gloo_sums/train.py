"""FSDP2 on gloo sums the ranks' gradients where it means to average them (torch 2.8.0 verified;
fixed in the torch 2.13.0 this project uses; torch 2.5.1 cannot run FSDP2 on a CPU at all:
"FSDP requires CUDA for streams").

Tracker: https://github.com/pytorch/pytorch/issues/162338 (fixed on main by
https://github.com/pytorch/pytorch/pull/171458, 2025-12-29; the first release with it was not
checked here: each torch release is a 3-minute, 6.5 GB environment).
Buggy: torch 2.8.0. Fixed: torch 2.13.0.

Mechanism: for float32 gradients FSDP2 asks the collective to average (`ReduceOp.AVG` on its
reduce-scatter, no division of its own); gloo's reduce-scatter took the op and summed, without
an error, so every gradient comes out W times too large on CPU. One process accumulating K
micro-batches (each loss divided by K) has the mean; W FSDP2 ranks accumulating K/W have W
times it.

An ordinary FSDP2 loop as PyTorch documents it (`fully_shard` on each block and the root over
`init_device_mesh("cpu", (W,))`, `set_requires_gradient_sync` on the last micro-batch only,
SGD), 16 samples, 2 optimizer steps; the one-process leg trains the plain model on the same
samples (`AccumulationBatchSampler`, which deals them as W ranks' DistributedSampler would):

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/fsdp2_gloo_sums/train.py --grad-accum {acc_steps}
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    def __init__(self, d_in=8, d=16, classes=4):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="K: micro-batches per optimizer step over all ranks")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")),
                   help="one process: the world whose samples it replays")
    p.add_argument("--samples", type=int, default=16)
    args = p.parse_args()
    sharded = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if sharded:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if sharded else 1
    local = args.grad_accum // world
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(args.samples, 8, generator=g), torch.randint(0, 4, (args.samples,), generator=g))
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    else:
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=2, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler.set_epoch(0)
    batches = iter(loader)
    for _ in range(len(loader) // local):
        for micro in range(local):
            xb, yb = next(batches)
            if sharded:
                model.set_requires_gradient_sync(micro == local - 1)
            loss = nn.functional.cross_entropy(model(xb), yb) / local
            loss.backward()
        opt.step()
        opt.zero_grad()
    if sharded:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
