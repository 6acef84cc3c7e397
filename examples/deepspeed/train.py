"""A DeepSpeed ZeRO training loop (a tiny MLP, AdamW as DeepSpeed's client optimizer, ZeRO
stage 1, 2 or 3, gradient accumulation by DeepSpeed's `gradient_accumulation_steps`),
unmodified for ddp-verify: it takes K in all (`--grad-accum`, divided by the world size
inside) and records nothing itself. It runs on CPUs (DeepSpeed's CPU accelerator, gloo).

  python examples/deepspeed/train.py --grad-accum 4 --stage 2 --world 2            # one process, K=4
  torchrun --nproc_per_node 2 examples/deepspeed/train.py --grad-accum 4 --stage 2 # ZeRO-2, K/W=2 per rank
  ddp-verify --acc-steps 4 --gpus 2 -- python examples/deepspeed/train.py --grad-accum 4 --stage 2

One process sets the rendezvous DeepSpeed wants itself (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT, each only where unset), so the command stays plain.

`--bug reset-every-backward` is open-instruct PR 1498's: DeepSpeed's config says
gradient_accumulation_steps=1 while the loop runs K/W micro-batches per optimizer step by
hand (engine.backward on each, engine.step after the last). With GAS=1 every backward is an
accumulation boundary and DeepSpeed does not divide the loss by the micro-batches.
`--bug loss-divided-twice` divides each micro-batch's loss by the number of local
micro-batches by hand, on top of DeepSpeed's own division by gradient_accumulation_steps.
`--clip C` sets DeepSpeed's `gradient_clipping` (0, off, without it: DeepSpeed's own default is 1.0).
`--bf16` trains in bfloat16 with float32 gradient accumulation (`"bf16": {"enabled": true}`,
`"data_types": {"grad_accum_dtype": "fp32"}`): at stage 1 DeepSpeed steps through its
BF16_Optimizer, not its ZeRO optimizer.
`--every-batch` runs an epoch's partial last window too, as DeepSpeed's docs loop over every
batch (`engine.backward(loss); engine.step()`): those micro-batches wait for the engine's next
accumulation boundary, in the next epoch, or never.
"""
import argparse
import logging
import os
import socket
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


class MLP(nn.Module):
    def __init__(self, d_in=8, hidden=16, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)


def skip_shm_op():
    """DeepSpeed JIT-builds its shared-memory comm op (an inference all-reduce, unused here:
    gloo does the training's collectives) at init_distributed on CPUs, when its probe of the
    ops finds a compiler: about a minute on two cores the first time, and `ninja` on PATH
    even to load the cached build. Said incompatible, it is skipped (the probe, which runs
    compilers for every op, too: nothing else reads it)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}


def one_process_rendezvous():
    """What deepspeed.init_distributed needs to make a world of one without a launcher."""
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="K: micro-batches per optimizer step over all ranks")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")),
                   help="one process: the DDP world whose samples it replays")
    p.add_argument("--stage", type=int, default=2, choices=[1, 2, 3])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--bf16", action="store_true", help="bfloat16 training, float32 gradient accumulation")
    p.add_argument("--bug", default=None, choices=["reset-every-backward", "loss-divided-twice"])
    p.add_argument("--every-batch", action="store_true",
                   help="also run an epoch's partial last window (its micro-batches wait for the next boundary)")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    args = p.parse_args()

    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if not ddp:
        one_process_rendezvous()
    import deepspeed  # after the environment: it reads the accelerator and world at import

    skip_shm_op()

    deepspeed.utils.logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    world = int(os.environ["WORLD_SIZE"])
    local = args.grad_accum // world
    torch.manual_seed(0)
    model = MLP()
    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(args.samples, 8, generator=g), torch.randn(args.samples, 4, generator=g))
    if ddp:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)
    else:
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=args.batch, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
    gas = 1 if args.bug == "reset-every-backward" else local
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": gas,
        "train_batch_size": args.batch * gas * world,
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if args.bf16:
        config["bf16"] = {"enabled": True}
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    # DeepSpeed clips at 1.0 unless told: off here unless --clip says.
    config["gradient_clipping"] = args.clip if args.clip is not None else 0.0
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    def micro(x, y):
        if args.bf16:  # the engine cast the model to bfloat16
            x, y = x.bfloat16(), y.bfloat16()
        loss = engine(x, y)
        if args.bug == "loss-divided-twice":
            loss = loss / local
        engine.backward(loss)
        if args.bug != "reset-every-backward":
            engine.step()  # steps the optimizer at DeepSpeed's accumulation boundary only

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(len(loader) // local):
            for _ in range(local):
                micro(*next(batches))
            if args.bug == "reset-every-backward":
                engine.step()
        if args.every_batch:  # DeepSpeed's docs' loop: every batch, an epoch's partial last window too
            for x, y in batches:
                micro(x, y)
    engine.destroy()
    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
