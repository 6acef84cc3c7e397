"""A plain DDP loop in the style of pytorch/examples' DDP tutorial: it keeps a snapshot in
./checkpoints (relative to where it runs) and resumes from it when there is one, and its model
trains with dropout on as libraries' defaults do (p=0.1). Unmodified for ddp-verify:

  ddp-verify --acc-steps 4 --gpus 2 -- torchrun --nproc-per-node 2 examples/checkpoints/train.py --grad-accum {local_acc_steps}

Both legs run in the same working folder: ddp-verify moves the first leg's ./checkpoints
aside before the next leg starts, so that no leg resumes from another's snapshot, and says
so in the report. Dropout draws other masks in one process than on W ranks: the report names
it, and `--no-dropout` checks the rest of the loop.

`--hang-at-exit RANK`: that rank blocks forever at interpreter exit, after training and after
its process group is destroyed, as gloo's process-group destructor sometimes does (timm):
ddp-verify judges the complete trace, stops the rank after --exit-grace and says so.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Hang:
    """Blocks its process when collected at interpreter exit (after atexit's handlers)."""

    def __init__(self):
        import time

        self.sleep = time.sleep

    def __del__(self):
        while True:
            self.sleep(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step in this process")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1, help="as libraries' defaults")
    p.add_argument("--snapshot", default="checkpoints/snapshot.pt", help="relative to the working folder")
    p.add_argument("--hang-at-exit", type=int, default=None, metavar="RANK")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(args.dropout), torch.nn.Linear(16, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    epochs_run = 0
    if os.path.exists(args.snapshot):  # the tutorial's resume
        snap = torch.load(args.snapshot)
        model.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        epochs_run = snap["epochs_run"]
    ddp = DDP(model)

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(args.samples, 8, generator=g), torch.randn(args.samples, 1, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(data, world, rank, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler)
    for epoch in range(epochs_run, args.epochs):
        batches = list(loader)
        for start in range(0, len(batches) - args.grad_accum + 1, args.grad_accum):
            window = batches[start : start + args.grad_accum]
            for i, (xb, yb) in enumerate(window):
                last = i == len(window) - 1
                ctx = ddp.no_sync() if not last else torch.enable_grad()
                with ctx:
                    loss = torch.nn.functional.mse_loss(ddp(xb), yb) / args.grad_accum
                    loss.backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:  # the tutorial's snapshot after each epoch, EPOCHS_RUN = this epoch
            os.makedirs(os.path.dirname(args.snapshot) or ".", exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epochs_run": epoch}
            torch.save(state, args.snapshot)
    dist.destroy_process_group()
    if args.hang_at_exit == rank:
        globals()["_hang"] = Hang()


if __name__ == "__main__":
    main()
