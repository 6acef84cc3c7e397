"""An Accelerate loop in the style of its documentation (accelerator.accumulate, clipping, a
prepared scheduler), unmodified for ddp-verify: K/W per process comes in as an argument.

  ddp-verify --acc-steps 4 --gpus 2 -- python examples/accelerate/train.py --grad-accum {local_acc_steps}

Accelerate deals whole batches to the processes round robin, so one process accumulating K
batches sees exactly the samples of W processes accumulating K/W.

`--bug divide-by-k`: the loss divided by K on top of accelerator.accumulate, which already
divides it (K x K in one process, K/W x K/W under DDP); with `--clip 0.3` only DDP's larger
gradient is clipped, so the factor arrives bent.
`--mixed-precision bf16`: Accelerate's bfloat16 autocast (on the CPU, torch's CPU autocast).
`--bug scheduler-per-process`: the scheduler is prepared by Accelerate, which steps it once
per process at every optimizer step, so under DDP it runs W times as fast.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step in this process")
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--samples", type=int, default=32, help="N: samples in the data set")
    p.add_argument("--batch", type=int, default=2, help="micro-batch size")
    p.add_argument("--bug", default=None, choices=["divide-by-k", "scheduler-per-process"])
    p.add_argument("--mixed-precision", default="no", choices=["no", "bf16"], help="Accelerate's mixed_precision")
    args = p.parse_args()
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=args.grad_accum, mixed_precision=args.mixed_precision
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=args.batch, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    if args.bug == "scheduler-per-process":
        model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    else:
        # Stepped once per optimizer step by hand, whatever the number of processes.
        model, opt, loader = accelerator.prepare(model, opt, loader)
    for xb, yb in loader:
        with accelerator.accumulate(model):
            loss = F.mse_loss(model(xb), yb)
            if args.bug == "divide-by-k":
                loss = loss / args.grad_accum
            accelerator.backward(loss)
            if args.clip is not None and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            if accelerator.sync_gradients:
                sched.step()
            opt.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
