"""A Lightning run (accumulate_grad_batches, DDP on CPU processes), unmodified for ddp-verify
but for one line: the one-process leg deals its batches as W ranks' DistributedSampler would
(`AccumulationBatchSampler`), which Lightning puts in under DDP itself.

  ddp-verify --acc-steps 4 --gpus 2 -- python examples/lightning/train.py --grad-accum {local_acc_steps} --gpus {gpus}

`--bug divide-by-k` divides the loss by accumulate_grad_batches in training_step, on top of
Lightning's own division: K x K/W in DDP, K x K in one process.
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
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        if self.bug == "divide-by-k":
            loss = loss / self.trainer.accumulate_grad_batches
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step in this process")
    p.add_argument("--gpus", type=int, default=2, help="the DDP world the one-process leg replays")
    p.add_argument("--bug", default=None, choices=["divide-by-k"])
    args = p.parse_args()
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True).sin())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        # Lightning replaces the sampler with DistributedSampler(shuffle=True, seed=0).
        loader = DataLoader(data, batch_size=2, shuffle=True)
        strategy = "ddp"
    else:
        loader = DataLoader(data, batch_sampler=AccumulationBatchSampler(len(data), world=args.gpus, batch_size=2))
        strategy = "auto"
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy=strategy, max_epochs=2, accumulate_grad_batches=args.grad_accum,
        gradient_clip_val=None, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True,
    )
    trainer.fit(Regressor(args.bug), loader)


if __name__ == "__main__":
    main()
