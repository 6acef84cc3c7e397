"""A plain DDP loop over a data set of any size N, for `ddp-verify explore`.

    ddp-verify explore --max-gpus 3 -- python examples/uneven/train.py \
        --samples {data_size} --batch {batch} --grad-accum {local_acc_steps}

Under torchrun each rank takes its shard from DistributedSampler (its default
drop_last=False pads N up to a multiple of W by repeating samples), in one process a plain
DataLoader reads the data in order. It steps once per K micro-batches and leaves a last
partial window out. That is equivalent when N is a multiple of W x B, and not otherwise:
DDP repeats samples, or ends each rank's shard with a short batch. `--deal accumulation`
deals the one process as W ranks of DistributedSampler would (AccumulationBatchSampler): right
at every N. `--sampler-drop-last` passes drop_last=True to DDP's DistributedSampler only (the
one process keeps every sample); `--loader-drop-last` to both DataLoaders (each rank drops its
own shard's short batch, the one process only the whole set's).
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=16, help="N: samples in the data set")
    p.add_argument("--batch", type=int, default=2, help="B: micro-batch size")
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per step on each process (K/W)")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")))
    p.add_argument("--deal", default="plain", choices=["plain", "accumulation"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--sampler-drop-last", action="store_true")
    p.add_argument("--loader-drop-last", action="store_true")
    args = p.parse_args()

    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if ddp else 1
    local = args.grad_accum
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 4, generator=g)
    dataset = TensorDataset(x, x.sum(1, keepdim=True).sin())
    if ddp:
        sampler = DistributedSampler(dataset, shuffle=False, drop_last=args.sampler_drop_last)
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, drop_last=args.loader_drop_last)
        model = nn.parallel.DistributedDataParallel(model)
    elif args.deal == "accumulation":
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=args.batch, shuffle=False)
        loader = DataLoader(dataset, batch_sampler=sampler)
    else:
        sampler = None
        loader = DataLoader(dataset, batch_size=args.batch, shuffle=False, drop_last=args.loader_drop_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(len(loader) // local):
            for micro in range(local):
                xb, yb = next(batches)
                if ddp:
                    model.require_backward_grad_sync = micro == local - 1
                loss = nn.functional.mse_loss(model(xb), yb) / local
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    if ddp:
        del model, opt
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
