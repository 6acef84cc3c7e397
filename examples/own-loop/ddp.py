"""The seed article's script, DDP run (its distributed branch), recording a trace for
`ddp-verify compare`: the lines marked `# ddp-verify` are all it takes.

  torchrun --standalone --nproc_per_node=2 examples/own-loop/ddp.py --out DIR   # DIR/ddp.safetensors

Every rank records (step() averages the gradient magnitudes over the ranks); rank 0 writes.
NCCL on one GPU per rank where there are enough GPUs, else gloo on the CPU.
"""
import argparse
import os
import random

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.optim as optim
import torch.distributed as dist
from torch.distributed import init_process_group
from torch.utils.data import DataLoader, Dataset

from ddp_verify_trace import TraceRecorder  # ddp-verify


class data_set(Dataset):

    def __init__(self, df):
        self.df = df

    def __len__(self):
        return len(self.df)

    def __getitem__(self, index):
        sample = self.df[index]
        return index, sample


class NeuralNetwork(nn.Module):
    def __init__(self, dsize):
        super().__init__()
        self.linear = nn.Linear(dsize, 1, bias=False)
        self.linear.weight.data[:] = 1.

    def forward(self, x):
        x = self.linear(x)
        loss = x.sum()
        return loss


def main(args=None):

    d_size = args.data_size

    # NCCL needs a GPU of its own for each rank (the article's two); else gloo on the CPU.
    gpus = torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"])
    init_process_group(backend="nccl" if gpus else "gloo")
    if gpus:
        device = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(device)
    else:
        device = "cpu"

    # fix the seed for reproducibility
    seed = args.seed

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    cudnn.benchmark = True

    # generate data
    data = torch.rand(d_size, d_size)

    model = NeuralNetwork(args.data_size)
    model = model.to(device)

    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if gpus else None)

    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = data_set(data)

    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)

    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=0,
        pin_memory=gpus,
        sampler=sampler,
        shuffle=False,
        collate_fn=None,
    )

    rec = TraceRecorder(model, os.path.join(args.out, "ddp.safetensors"), overwrite=args.force, acc_steps=dist.get_world_size(), steps_per_epoch=len(loader))  # ddp-verify

    for epoch in range(args.epochs):

        loader.sampler.set_epoch(epoch)

        for i, (idxs, row) in enumerate(loader):

            optimizer.zero_grad()

            row = row.to(device, non_blocking=True)

            rank = dist.get_rank() == 0

            loss = model(row)

            # does average gradients automatically thanks to model wrapper into
            # `DistributedDataParallel`
            loss.backward()

            if i == 0 and rank:
                print(f"Epoch {epoch} {100 * '='}")

            rec.step()  # ddp-verify
            optimizer.step()

    rec.close()  # ddp-verify
    if args.verbose and rank:
        print(100 * "=")
        print("Model weights : ", model.module.linear.weight)
        print(100 * "=")


if __name__ == "__main__":

    parser = argparse.ArgumentParser()
    parser.add_argument('--seed', default=0, type=int)
    parser.add_argument('--epochs', default=2, type=int)
    parser.add_argument('--batch_size', default=4, type=int)
    parser.add_argument('--data_size', default=16, type=int)
    parser.add_argument('--acc_steps', default=3, type=int)  # unused here, as in the article's DDP run
    parser.add_argument('--verbose', action='store_true',)
    parser.add_argument('--out', default="out/own-loop", help="writes OUT/ddp.safetensors")  # ddp-verify
    parser.add_argument('--force', action='store_true', help="replace an existing trace")  # ddp-verify

    args = parser.parse_args()

    print(args)

    main(args)
    # Destroyed here, after main's frame (and DDP's reducer with it) is gone: torch 2.13's
    # gloo otherwise aborts or hangs at exit now and then ("terminate called without an
    # active exception"), the reducer dropping the group while a gloo thread waits for the GIL.
    world = dist.group.WORLD
    dist.destroy_process_group()
    del world
