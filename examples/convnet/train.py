"""A small conv net in a plain DDP loop (torchvision's CIFAR tutorial's shape on random
16x16 images), for the big batch: its gradients sum over every sample and every output
position, so one batch of K·B samples adds K times as many terms in one reduction as each of
K micro-batches of B does.

  ddp-verify --acc-steps 4 --gpus 2 --batch-size 4 -- python examples/convnet/train.py --grad-accum {local_acc_steps} --batch {batch}

Run under torchrun (the DDP leg) it shards with DistributedSampler; one process reads the
same samples in the same order (shuffle off), so every leg trains on each step's samples,
grouped otherwise: ddp-verify holds such regrouped steps to K times the tolerance
(docs/bounds.md). `--bug last-scaled` is a small bug that must still be caught.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--bug", default=None, choices=["last-scaled"],
                   help="last-scaled: each window's last micro-batch's loss weighs 1.001: a small bug the "
                        "regrouped tolerance must still catch")
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64, 10),
    )
    net = DDP(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(args.samples, 3, 16, 16, generator=g), torch.randint(0, 10, (args.samples,), generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(data, world, rank, shuffle=False)
    batches = list(torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler))
    for step in range(args.steps):
        window = batches[step * args.grad_accum : (step + 1) * args.grad_accum]
        if len(window) < args.grad_accum:
            break
        for i, (xb, yb) in enumerate(window):
            sync = i == len(window) - 1 or world == 1
            with net.no_sync() if not sync else torch.enable_grad():
                loss = torch.nn.functional.cross_entropy(net(xb), yb) / args.grad_accum
                if args.bug == "last-scaled" and i == len(window) - 1:
                    loss = loss * 1.001
                loss.backward()
        opt.step()
        opt.zero_grad()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
