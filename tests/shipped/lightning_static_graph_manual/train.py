"""Lightning's manual optimization under `DDPStrategy(static_graph=True)`: the first step's
backwards are not all-reduced, so each rank steps with its own gradient there.

Mechanism: in manual optimization Lightning runs the backward inside DDP's forward and
prepares DDP's reducer itself (`pytorch_lightning.overrides.distributed.prepare_for_backward`),
copying what DistributedDataParallel's forward does but not its first-iteration step for a
static graph (the delayed all-reduce torch enqueues at iteration 1), so under static_graph=True
the ranks' gradients of the first step stay local. The script is right: it asks Lightning's
strategy for a static graph, which DDP supports.

An ordinary manual-optimization LightningModule (`automatic_optimization = False`,
`manual_backward` of each micro-batch's loss / the micro-batches per process, `opt.step()` and
`opt.zero_grad()` at the window's end), strategy `DDPStrategy(static_graph=True)` on CPU
processes, 16 samples; the one-process leg deals its batches as W ranks' DistributedSampler
would (`AccumulationBatchSampler`):

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/lightning_static_graph_manual/train.py --grad-accum {local_acc_steps} --gpus {gpus}
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
    def __init__(self, k):
        super().__init__()
        self.k = k
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        loss = F.mse_loss(self.net(x), y)
        self.manual_backward(loss / self.k)
        if (batch_idx + 1) % self.k == 0:
            opt.step()
            opt.zero_grad()

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
        from pytorch_lightning.strategies import DDPStrategy

        # Lightning replaces the sampler with DistributedSampler(shuffle=True, seed=0).
        loader = DataLoader(data, batch_size=2, shuffle=True)
        strategy = DDPStrategy(static_graph=True)
    else:
        loader = DataLoader(data, batch_sampler=AccumulationBatchSampler(len(data), world=args.gpus, batch_size=2))
        strategy = "auto"
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy=strategy, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    )
    trainer.fit(Regressor(args.grad_accum), loader)


if __name__ == "__main__":
    main()
