"""A nanoGPT-style training loop (a tiny GPT, AdamW, gradient accumulation, DDP under torchrun),
unmodified for ddp-verify: it takes K in all (`--grad-accum`, divided by the world size inside,
as nanoGPT does) and records nothing itself.

  python examples/nanogpt/train.py --grad-accum 4 --world 2              # one process, K=4
  torchrun --nproc_per_node 2 examples/nanogpt/train.py --grad-accum 4   # DDP, K/W=2 per rank
  ddp-verify --acc-steps 4 --gpus 2 -- python examples/nanogpt/train.py --grad-accum 4

`--bug sync-after-forward` is build-nanogpt PR 30's: `require_backward_grad_sync` set after
the forward, which DDP reads in the forward, so the last micro-step is never all-reduced.
`--bug step-every-micro-batch` steps the optimizer after each micro-batch.
`--optimizer adam|rmsprop` (AdamW by default): honest loops under other adaptive optimizers.
`--bug forward-raw-model` calls nanoGPT's `raw_model` (DDP's `.module`) in the loop, so DDP
never sees a forward and nothing all-reduces the gradients.
`--always-sync` never touches `require_backward_grad_sync` (nor `no_sync`): correct, but every
micro-batch's backward all-reduces (seed 002's slowdown), which ddp-verify cautions about.
"""
import argparse
import gc
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, block=16, d=32, heads=2, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="K: micro-batches per optimizer step over all ranks")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")),
                   help="one process: the DDP world whose samples it replays")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "adam", "rmsprop"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--always-sync", action="store_true")
    p.add_argument("--bug", default=None, choices=["sync-after-forward", "step-every-micro-batch", "forward-raw-model"])
    args = p.parse_args()

    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if ddp else 1
    local = args.grad_accum // world if ddp else args.grad_accum
    torch.set_default_dtype(getattr(torch, args.dtype))
    torch.manual_seed(0)
    model = GPT()
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (args.samples, 17), generator=g)
    dataset = TensorDataset(data[:, :-1], data[:, 1:])
    if ddp:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)
        model = nn.parallel.DistributedDataParallel(model)
    raw_model = model.module if ddp else model
    forward = raw_model if args.bug == "forward-raw-model" else model
    if not ddp:
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=args.batch, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
    opt = {
        "adamw": lambda: torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
        "adam": lambda: torch.optim.Adam(model.parameters(), lr=args.lr),
        "rmsprop": lambda: torch.optim.RMSprop(model.parameters(), lr=args.lr / 3),
    }[args.optimizer]()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(len(loader) // local):
            for micro_step in range(local):
                x, y = next(batches)
                if ddp and args.bug != "sync-after-forward" and not args.always_sync:
                    model.require_backward_grad_sync = micro_step == local - 1
                loss = forward(x, y) / local
                if ddp and args.bug == "sync-after-forward":
                    model.require_backward_grad_sync = micro_step == local - 1
                loss.backward()
                if args.bug == "step-every-micro-batch":
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            if args.bug == "step-every-micro-batch":
                continue
            if args.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
    if ddp:
        # gloo aborts at exit now and then unless the reducer is gone before the group.
        del model, raw_model, forward, opt
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
