"""A Lightning run (accumulate_grad_batches, DDP on CPU processes), unmodified for ddp-verify
but for one line: the one-process leg deals its batches as W ranks' DistributedSampler would
(`AccumulationBatchSampler`), which Lightning puts in under DDP itself.

  ddp-verify --acc-steps 4 --gpus 2 -- python examples/lightning/train.py --grad-accum {local_acc_steps} --gpus {gpus}

`--bug divide-by-k` divides the loss by accumulate_grad_batches in training_step, on top of
Lightning's own division: K x K/W in DDP, K x K in one process.

`--manual every|last` optimizes manually (`automatic_optimization = False`), accumulating
`--grad-accum` micro-batches as Lightning's manual-optimization docs do: each loss divided by
that number into `manual_backward`, `opt.step(); opt.zero_grad()` after every that-many
batches. `every`: each backward is all-reduced under DDP (the docs' plain example); `last`:
only the last micro-batch's, the others inside `opt.toggle_model(sync_grad=False)` (the docs'
way to skip the synchronisation while accumulating).
`--with-ids` deals batches of (ids, x, y), as many datasets do: under DDP Lightning's wrapper
forwards the whole batch, so the first tensor its forward sees is the ids, where one process's
outermost forward is the network's, on x (the recorder's sample hashes then stand for other
tensors in each leg, and are not compared).
`--precision bf16-mixed` is Lightning's bfloat16 autocast (on the CPU, torch's CPU autocast).
`--manual last --bug sync-first` syncs the first micro-batch of each step instead of the last:
under DDP the later micro-batches' gradients never reach the other ranks.
"""
import argparse
import os

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


class Regressor(L.LightningModule):
    def __init__(self, bug):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.bug = bug

    def training_step(self, batch, i):
        x, y = batch[-2:]
        loss = F.mse_loss(self.net(x), y)
        if self.bug == "divide-by-k":
            loss = loss / self.trainer.accumulate_grad_batches
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class ManualRegressor(Regressor):
    """The same model, optimized manually: Lightning's documented gradient accumulation."""

    def __init__(self, bug, k, sync):
        super().__init__(bug)
        self.automatic_optimization = False
        self.k, self.sync = k, sync

    def training_step(self, batch, i):
        opt = self.optimizers()
        x, y = batch[-2:]
        last = (i + 1) % self.k == 0
        sync = True if self.sync == "every" else (i % self.k == 0 if self.bug == "sync-first" else last)
        with opt.toggle_model(sync_grad=sync):  # DDP's all-reduce of this backward, or not
            loss = F.mse_loss(self.net(x), y) / self.k
            self.manual_backward(loss)
        if last:
            opt.step()
            opt.zero_grad()
        return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step in this process")
    p.add_argument("--gpus", type=int, default=2, help="the DDP world the one-process leg replays")
    p.add_argument("--bug", default=None, choices=["divide-by-k", "sync-first"])
    p.add_argument("--with-ids", action="store_true", help="batches of (ids, x, y)")
    p.add_argument("--samples", type=int, default=32, help="N: samples in the data set")
    p.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"], help="Trainer(precision=)")
    p.add_argument("--manual", default=None, choices=["every", "last"],
                   help="manual optimization: all-reduce every micro-batch's backward, or the last one's only")
    args = p.parse_args()
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    y = x.sum(1, keepdim=True).sin()
    data = TensorDataset(torch.arange(len(x)), x, y) if args.with_ids else TensorDataset(x, y)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        # Lightning replaces the sampler with DistributedSampler(shuffle=True, seed=0).
        loader = DataLoader(data, batch_size=2, shuffle=True)
        strategy = "ddp"
    else:
        loader = DataLoader(data, batch_sampler=AccumulationBatchSampler(len(data), world=args.gpus, batch_size=2))
        strategy = "auto"
    # Manual optimization accumulates in training_step: the Trainer must not (it refuses to).
    accumulate = 1 if args.manual else args.grad_accum
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy=strategy, max_epochs=2, accumulate_grad_batches=accumulate,
        gradient_clip_val=None, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, precision=args.precision,
    )
    model = ManualRegressor(args.bug, args.grad_accum, args.manual) if args.manual else Regressor(args.bug)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
