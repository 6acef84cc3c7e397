"""Accelerate's `GradientAccumulationPlugin(sync_each_batch=True)` steps the optimizer after
every micro-batch (Accelerate 0.28.0, which added the option, to 0.30.1; fixed in 0.31.0).

Tracker: https://github.com/huggingface/accelerate/pull/2790 (fixes the option added by
https://github.com/huggingface/accelerate/pull/2531; reported in
https://github.com/huggingface/transformers/issues/29425).
Buggy: accelerate 0.30.1. Fixed: accelerate 0.31.0.

Mechanism: `sync_each_batch` is meant to all-reduce every micro-batch's gradients (no
`no_sync`, to save memory under FSDP) while still stepping once per K micro-batches. 0.30.1
implemented it as `_do_sync(force=True)`, which sets `sync_gradients=True` on every micro-batch;
`sync_gradients` is also what tells the prepared optimizer to step and zero, so every micro-batch
steps with its own gradient divided by the accumulation steps: K steps of 1/K in one process,
K/W steps of W/K under DDP. 0.31.0 keeps `sync_gradients` for the window's end and only leaves
`no_sync` out.

An ordinary loop as Accelerate documents it (`accelerator.accumulate`, a prepared optimizer
stepped and zeroed inside, Accelerate dealing batches round robin), 16 samples, 2 optimizer
steps:

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/accelerate_sync_each_batch/train.py --grad-accum {local_acc_steps}
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--samples", type=int, default=16)
    args = p.parse_args()
    plugin = GradientAccumulationPlugin(num_steps=args.grad_accum, sync_each_batch=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=2, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for xb, yb in loader:
        with accelerator.accumulate(model):
            loss = F.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
