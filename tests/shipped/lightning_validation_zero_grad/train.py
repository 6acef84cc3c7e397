"""Lightning zeroes the gradients when it enters validation, also in the middle of an
accumulation window, throwing away the micro-batches accumulated so far (Lightning up to
2.0.9; fixed in 2.1.0).

Tracker: https://github.com/Lightning-AI/pytorch-lightning/pull/18710
Buggy: pytorch-lightning 2.0.9. Fixed: pytorch-lightning 2.1.0.

Mechanism: the evaluation loop called `lightning_module.zero_grad()` on entering validation,
to free memory, whatever the training loop's state; with `val_check_interval` counting
training batches, a validation that falls inside an accumulation window erases the window's
earlier micro-batches. The interval counts each process's own batches, so it falls at other
points of the windows in the two runs: every 2 batches is mid-window for one process
accumulating K=4 (half of each window lost) and at each window's end for W=2 ranks
accumulating K/W=2 (nothing lost). 2.1.0 zeroes only at a window's end
(`on_validation_model_zero_grad`).

An ordinary Lightning run (`Trainer(accumulate_grad_batches=..., val_check_interval=2,
limit_val_batches=1)`, a validation_step, strategy "ddp" on CPU processes), 16 samples, 2
optimizer steps. The one-process leg deals its batches as W ranks' DistributedSampler would
(`AccumulationBatchSampler`), which Lightning puts in under DDP itself. Setuptools is pinned
below 81 in its environments: these Lightning releases import pkg_resources.

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/lightning_validation_zero_grad/train.py --grad-accum {local_acc_steps} --gpus {gpus}
"""
import argparse
import os

import pytorch_lightning as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--gpus", type=int, default=2, help="the DDP world the one-process leg replays")
    p.add_argument("--samples", type=int, default=16)
    args = p.parse_args()
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True).sin())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        # Lightning replaces the sampler with DistributedSampler(shuffle=True, seed=0).
        loader = DataLoader(data, batch_size=2, shuffle=True)
        strategy = "ddp"
    else:
        loader = DataLoader(data, batch_sampler=AccumulationBatchSampler(len(data), world=args.gpus, batch_size=2))
        strategy = "auto"
    val = DataLoader(data, batch_size=4)
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy=strategy, max_epochs=1, accumulate_grad_batches=args.grad_accum,
        val_check_interval=2, limit_val_batches=1, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(Regressor(), loader, val)


if __name__ == "__main__":
    main()
