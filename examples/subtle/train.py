"""A plain float32 DDP loop (an MLP of 11 Linear layers, 22 parameter tensors) with the small,
real mistakes that make one process with K micro-batches and W DDP ranks train differently,
each next to its honest twin (`--bug none`, the same other flags).

  python examples/subtle/train.py --grad-accum 4                            # one process, K=4
  torchrun --nproc_per_node 2 examples/subtle/train.py --grad-accum 2       # DDP, K/W=2 per rank
  ddp-verify --acc-steps 4 --gpus 2 -- python examples/subtle/train.py --grad-accum {local_acc_steps}

`--grad-accum` is the micro-batches per process. The data are dealt in blocks of `--batch`:
each optimizer step takes the next K blocks; the one process runs them in order, rank r of W
runs blocks r, r+W, r+2W, ... (local micro-batch i is block i*W + r), so both legs see the same
samples per step (in AccumulationBatchSampler's order) and the one process needs no W.

Each bug, with the flags its honest twin shares (a bug sets its own if they are left out):

  wd-local-batch            --scale-wd-to 16: weight decay scaled by the samples per step,
                            counted as grad_accum x batch (the process's, not the world's).
  rank-no-wd                rank 1 builds its optimizer without weight decay.
  group1-warmup-per-micro   --head-warmup 8: the head is a second param group warmed up by its
                            own LambdaLR, stepped after every micro-batch (K or K/W per step).
  unfreeze-after-ddp        --freeze-until 1: the first layer is frozen when DDP is built and
                            unfrozen at step 1; DDP never all-reduces it (honest: DDP rebuilt).
  uncertainty-outside-ddp   --loss-weights learned: the learned log-variances of the two tasks'
                            losses live outside the DDP module, with their own optimizer.
  ema-per-micro             --ema 0.9: the weights' EMA, copied into the model at the end,
                            updated after every micro-batch instead of every optimizer step.
  clip-per-rank-manual-allreduce   --sync manual --clip 0.05: no DDP wrapper; the gradients
                            all-reduced by hand (sum, / W), but each rank clips before that.
  wd-per-micro              --wd-by-hand: decoupled weight decay applied by hand
                            (p *= 1 - lr*wd), after every micro-batch instead of every step.
  per-rank-normaliser       --normaliser step: a masked sum over valid targets divided by the
                            rank's own count of the step, not the step's count over all ranks.
"""
import argparse
import contextlib
import gc
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn

BUGS = [
    "none",
    "wd-local-batch",
    "rank-no-wd",
    "group1-warmup-per-micro",
    "unfreeze-after-ddp",
    "uncertainty-outside-ddp",
    "ema-per-micro",
    "clip-per-rank-manual-allreduce",
    "wd-per-micro",
    "per-rank-normaliser",
]


class Net(nn.Module):
    """11 Linear layers with tanh between them; two regression targets. With `learned` loss
    weights the two tasks' log-variances are the module's own parameters (Kendall et al.)."""

    def __init__(self, d_in=8, width=24, depth=11, tasks=2, learned=False):
        super().__init__()
        dims = [d_in] + [width] * (depth - 1) + [tasks]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.log_vars = nn.Parameter(torch.zeros(tasks)) if learned else None

    def forward(self, x, y, mask=None, log_vars=None):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        err = (self.layers[-1](x) - y) ** 2
        if mask is not None:
            # The masked sum: the caller divides by its count of valid targets.
            return (err * mask).sum()
        s = self.log_vars if log_vars is None else log_vars
        if s is None:
            return err.mean()
        per_task = err.mean(0)
        return (torch.exp(-s) * per_task + s).sum()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--batch", type=int, default=4, help="B: micro-batch size")
    p.add_argument("--samples", type=int, default=64, help="N: samples (4 steps at K=4, B=4)")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "rmsprop"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=None, help="0.1 under AdamW, 0.01 under RMSprop")
    p.add_argument("--scale-wd-to", type=int, default=None, help="wd x samples per step / this")
    p.add_argument("--head-warmup", type=int, default=None, help="optimizer steps of the head's warm-up")
    p.add_argument("--freeze-until", type=int, default=None, help="step at which the first layer is unfrozen")
    p.add_argument("--loss-weights", default="fixed", choices=["fixed", "learned"])
    p.add_argument("--ema", type=float, default=None, help="EMA decay; the EMA is the final model")
    p.add_argument("--sync", default="ddp", choices=["ddp", "manual"])
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--wd-by-hand", action="store_true")
    p.add_argument("--normaliser", default="micro", choices=["micro", "step"])
    p.add_argument("--bug", default="none", choices=BUGS)
    args = p.parse_args()
    # A bug needs the setting it is a mistake in; its honest twin passes the same flags.
    implied = {
        "wd-local-batch": ("scale_wd_to", 16),
        "group1-warmup-per-micro": ("head_warmup", 8),
        "unfreeze-after-ddp": ("freeze_until", 1),
        "uncertainty-outside-ddp": ("loss_weights", "learned"),
        "ema-per-micro": ("ema", 0.9),
        "clip-per-rank-manual-allreduce": ("clip", 0.05),
        "wd-per-micro": ("wd_by_hand", True),
        "per-rank-normaliser": ("normaliser", "step"),
    }
    if args.bug in implied:
        name, value = implied[args.bug]
        if getattr(args, name) in (None, False, "fixed", "micro"):
            setattr(args, name, value)
    if args.bug == "clip-per-rank-manual-allreduce":
        args.sync = "manual"

    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if ddp else 1
    rank = dist.get_rank() if ddp else 0
    local = args.grad_accum
    k = local * world
    steps = args.samples // (k * args.batch)

    torch.manual_seed(0)
    outside = args.bug == "uncertainty-outside-ddp"
    raw = Net(learned=args.loss_weights == "learned" and not outside)
    log_vars = nn.Parameter(torch.zeros(2)) if outside else None
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 8, generator=g)
    y = torch.stack([x[:, :4].sum(1).sin(), x[:, 4:].prod(1).tanh()], 1)
    mask = (torch.rand(args.samples, 2, generator=g) < 0.5).float()

    first = list(raw.layers[0].parameters())
    if args.freeze_until is not None:
        for q in first:
            q.requires_grad_(False)
    wrap = ddp and args.sync == "ddp"
    model = nn.parallel.DistributedDataParallel(raw) if wrap else raw

    # Weight decay: AdamW's decoupled one, RMSprop's L2 term.
    wd = args.weight_decay if args.weight_decay is not None else {"adamw": 0.1, "rmsprop": 0.01}[args.optimizer]
    if args.scale_wd_to is not None:
        per_step = local * args.batch if args.bug == "wd-local-batch" else local * world * args.batch
        wd = wd * per_step / args.scale_wd_to
    if args.bug == "rank-no-wd" and rank == 1:
        wd = 0.0
    by_hand = args.wd_by_hand
    opt_wd = 0.0 if by_hand else wd
    make = {
        "adamw": lambda params: torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=opt_wd),
        "rmsprop": lambda params: torch.optim.RMSprop(params, lr=args.lr, weight_decay=opt_wd),
    }[args.optimizer]
    head = list(raw.layers[-1].parameters())
    body = [q for q in raw.parameters() if all(q is not h for h in head)]
    sched = None
    if args.head_warmup is not None:
        opt = make([{"params": body}, {"params": head}])
        warm = args.head_warmup
        sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 1.0, lambda s: min(1.0, (s + 1) / warm)])
    else:
        opt = make(list(raw.parameters()))
    opt_s = make([log_vars]) if outside else None
    ema = [q.detach().clone() for q in raw.parameters()] if args.ema is not None else None

    def decay():
        with torch.no_grad():
            for group in opt.param_groups:
                for q in group["params"]:
                    q.mul_(1 - group["lr"] * wd)

    def update_ema():
        with torch.no_grad():
            for e, q in zip(ema, raw.parameters()):
                e.mul_(args.ema).add_(q, alpha=1 - args.ema)

    for step in range(steps):
        if args.freeze_until is not None and step == args.freeze_until:
            for q in first:
                q.requires_grad_(True)
            if wrap and args.bug != "unfreeze-after-ddp":
                # The fix: a new DDP sees the unfrozen layer and all-reduces its gradient.
                old, model = model, nn.parallel.DistributedDataParallel(raw)
                del old
                gc.collect()
        window = step * k
        blocks = [window + i * world + rank for i in range(local)]
        if args.normaliser == "step":
            count = sum(mask[b * args.batch : (b + 1) * args.batch].sum() for b in blocks)
            if ddp and args.bug != "per-rank-normaliser":
                dist.all_reduce(count)
        for i, b in enumerate(blocks):
            sl = slice(b * args.batch, (b + 1) * args.batch)
            last = i == local - 1
            quiet = model.no_sync() if wrap and not last else contextlib.nullcontext()
            with quiet:
                if args.normaliser == "step":
                    loss = model(x[sl], y[sl], mask=mask[sl]) / count
                    if ddp and args.bug != "per-rank-normaliser":
                        loss = loss * world  # DDP averages over the ranks
                else:
                    loss = model(x[sl], y[sl], log_vars=log_vars) / local
                loss.backward()
            if args.bug == "group1-warmup-per-micro":
                sched.step()
            if args.bug == "ema-per-micro":
                update_ema()
            if args.bug == "wd-per-micro":
                decay()
        if ddp and args.sync == "manual":
            if args.bug == "clip-per-rank-manual-allreduce":
                torch.nn.utils.clip_grad_norm_(raw.parameters(), args.clip)
            for q in raw.parameters():
                if q.grad is not None:
                    dist.all_reduce(q.grad)
                    q.grad /= world
        if args.clip is not None and not (ddp and args.bug == "clip-per-rank-manual-allreduce"):
            torch.nn.utils.clip_grad_norm_(raw.parameters(), args.clip)
        if by_hand and args.bug != "wd-per-micro":
            decay()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if opt_s is not None:
            opt_s.step()
            opt_s.zero_grad(set_to_none=True)
        if sched is not None and args.bug != "group1-warmup-per-micro":
            sched.step()
        if ema is not None and args.bug != "ema-per-micro":
            update_ema()
    if ema is not None:
        with torch.no_grad():
            for e, q in zip(ema, raw.parameters()):
                q.copy_(e)
    if ddp:
        # gloo aborts at exit now and then unless the reducer is gone before the group.
        del model, opt, opt_s
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
