"""A low-precision training loop written apart from the examples, for the tests of
docs/mixed-precision.md: a small sequence classifier (embedding, Conv1d, LayerNorm, a GELU
MLP, mean pooling), torchrun-launched in both legs (one process is a world of one), samples
dealt by `DistributedSampler` as the ranks see them, so the one process reads the same
samples in other micro-batches (regrouped steps), Adam with weight decay off, no clipping.

  torchrun --nproc-per-node 1 tests/precision/loop.py --accum 6 --precision bf16-autocast
  ddp-verify --acc-steps 6 --gpus 3 -- torchrun --nproc-per-node 3 tests/precision/loop.py --accum {local_acc_steps}

`--precision`:
  float32          nothing narrow;
  bf16-autocast    `torch.autocast("cpu", bfloat16)` around the forward, float32 weights;
  bf16-weights     `model.to(torch.bfloat16)`: weights, gradients and Adam's state in bfloat16;
  fp16-scaler      float16 autocast and `torch.amp.GradScaler("cpu")` (scale 2^12, `--init-scale`);
  fsdp2-bf16       FSDP2 `fully_shard` with MixedPrecisionPolicy(param_dtype=bfloat16), the
                   reduction in float32 (`--reduce bf16`: in bfloat16, FSDP2's default).

`--bug`, done by the ranks of a world of more than one (the one process trains honestly):
  loss-x1.03       each micro-batch's loss multiplied by 1.03;
  label-smoothing  cross-entropy with label_smoothing=0.05;
  divide-by-k      each loss divided by the K of all ranks, not this rank's K/W;
  cast-model       the model cast to bfloat16 (the one process keeps the chosen precision);
  rank-autocast    the last rank runs its forwards without the autocast the others enter.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Classifier(nn.Module):
    def __init__(self, vocab=40, d=24, classes=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.conv = nn.Conv1d(d, d, kernel_size=3, padding=1)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.out = nn.Linear(d, classes)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.conv(h.transpose(1, 2)).transpose(1, 2)
        h = h + self.mlp(self.norm(h))
        return self.out(h.mean(dim=1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--accum", type=int, required=True, help="micro-batches per optimizer step in this process")
    p.add_argument("--precision", default="bf16-autocast",
                   choices=["float32", "bf16-autocast", "bf16-weights", "fp16-scaler", "fsdp2-bf16"])
    p.add_argument("--reduce", default="fp32", choices=["fp32", "bf16"], help="fsdp2-bf16's reduce_dtype")
    p.add_argument("--bug", choices=["loss-x1.03", "label-smoothing", "divide-by-k", "cast-model", "rank-autocast"])
    p.add_argument("--init-scale", type=float, default=2.0**12, help="fp16-scaler's GradScaler(init_scale=)")
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--samples", type=int, default=108)
    args = p.parse_args()

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    bug = args.bug if world > 1 else None
    torch.manual_seed(7)
    model = Classifier()
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randint(0, 40, (args.samples, 10), generator=g),
                         torch.randint(0, 6, (args.samples,), generator=g))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)

    if args.precision == "bf16-weights" or bug == "cast-model":
        model = model.to(torch.bfloat16)
    if args.precision == "fsdp2-bf16":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        reduce = torch.bfloat16 if args.reduce == "bf16" else torch.float32
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model.mlp, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    elif world > 1:
        model = nn.parallel.DistributedDataParallel(model)

    autocast = {"bf16-autocast": torch.bfloat16, "fp16-scaler": torch.float16}.get(args.precision)
    if bug == "rank-autocast" and rank == world - 1:
        autocast = None
    scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale) if args.precision == "fp16-scaler" else None
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    smoothing = 0.05 if bug == "label-smoothing" else 0.0
    divisor = args.accum * world if bug == "divide-by-k" else args.accum

    batches = iter(loader)
    for step in range(len(loader) // args.accum):
        for micro in range(args.accum):
            tokens, labels = next(batches)
            last = micro == args.accum - 1
            if isinstance(model, nn.parallel.DistributedDataParallel):
                model.require_backward_grad_sync = last
            elif hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(last)
            with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                logits = model(tokens)
                loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)
            if bug == "loss-x1.03":
                loss = loss * 1.03
            loss = loss / divisor
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
