"""Lightning zeroes the gradients before every micro-batch, so nothing accumulates, when
`training_step` is written without its `batch_idx` argument (Lightning 2.0.0 to 2.0.9; fixed
in 2.1.0).

Tracker: https://github.com/Lightning-AI/pytorch-lightning/pull/18619
Buggy: pytorch-lightning 2.0.9. Fixed: pytorch-lightning 2.1.0.

Mechanism: Lightning 2.0 let `training_step(self, batch)` leave `batch_idx` out, and then
passed the hook's keyword arguments on without it; the automatic optimisation loop read the
index back as `kwargs.get("batch_idx", 0)`, so every micro-batch looked like the first of its
window (`batch_idx % accumulate_grad_batches == 0`) and had the gradients zeroed before its
backward. Each optimizer step then has only the window's last micro-batch, divided by
accumulate_grad_batches: 1/K of one micro-batch in one process, the average over ranks of
W/K of one micro-batch each under DDP.

An ordinary Lightning run (a LightningModule whose training_step takes the batch alone,
`Trainer(accumulate_grad_batches=...)`, strategy "ddp" on CPU processes), 16 samples, 2
optimizer steps. The one-process leg deals its batches as W ranks' DistributedSampler would
(`AccumulationBatchSampler`), which Lightning puts in under DDP itself. Setuptools is pinned
below 81 in its environments: these Lightning releases import pkg_resources.

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/lightning_no_batch_idx/train.py --grad-accum {local_acc_steps} --gpus {gpus}
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

    def training_step(self, batch):
        x, y = batch
        return F.mse_loss(self.net(x), y)

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
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy=strategy, max_epochs=1, accumulate_grad_batches=args.grad_accum,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(Regressor(), loader)


if __name__ == "__main__":
    main()
