"""An ordinary loop written the way tutorials write it, unlike the corpus's other scripts: the
one process takes consecutive micro-batches from a plain DataLoader over the shuffled samples, and W ranks take
DistributedSampler's strided shares of the same permutation. Each optimizer step covers the
same samples in both runs, grouped into other micro-batches ([0,1], [2,3] in one process;
[0,2] on rank 0 and [1,3] on rank 1), which a mean loss over equal micro-batches does not see.

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/_plain_loop.py --grad-accum {local_acc_steps}

  --engine ddp|fsdp2   DistributedDataParallel, or FSDP2's fully_shard over a CPU mesh (gloo)
  --clip C             clip_grad_norm_ before each step (C large: on, never active)
  --divide k|none      each micro-batch's loss divided by the process's micro-batches, or never
                       (a script that forgets to: one process's gradient is K times the mean,
                       each rank's K/W times)
  --norm none|batch    BatchNorm1d after the first layer: it mixes a micro-batch's samples, so
                       the grouping into micro-batches now changes the gradients
  --tail held|k        the epoch's last window, short where the samples are no whole number of
                       windows, stepped with each loss divided by the micro-batches it holds, or
                       by K all the same (half the mean where it holds half a window)
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


class Net(nn.Module):
    def __init__(self, d_in=6, d=12, classes=3, norm="none"):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(d_in, d), nn.BatchNorm1d(d)) if norm == "batch" else nn.Linear(d_in, d)
        self.mid = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.out = nn.Linear(d, classes)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(h + self.mid(h))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=48)
    p.add_argument("--engine", default="ddp", choices=["ddp", "fsdp2"])
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--divide", default="k", choices=["k", "none"])
    p.add_argument("--tail", default="held", choices=["held", "k"])
    p.add_argument("--norm", default="none", choices=["none", "batch"])
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Net(norm=args.norm)
    g = torch.Generator().manual_seed(7)
    data = TensorDataset(torch.randn(args.samples, 6, generator=g), torch.randint(0, 3, (args.samples,), generator=g))
    if world > 1:
        if args.engine == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            fully_shard(model.mid, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            model = nn.parallel.DistributedDataParallel(model)
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    else:
        # DistributedSampler's permutation (seed 0, epoch 0), read in order.
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
        loader = DataLoader(Subset(data, order), batch_size=args.batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    k, n = args.grad_accum, len(loader)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % k == 0 or i == n - 1
        # The micro-batches this window holds: k, or fewer in the epoch's last.
        held = k if args.tail == "k" else min(k, n - (i // k) * k)
        if world > 1 and args.engine == "fsdp2":
            model.set_requires_gradient_sync(last)
        loss = nn.functional.cross_entropy(model(x), y)
        if args.divide == "k":
            loss = loss / held
        if world > 1 and args.engine == "ddp" and not last:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
        if last:
            if args.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
