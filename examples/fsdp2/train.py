"""An FSDP2 training loop as PyTorch documents it (`fully_shard` on each block and the root over
`init_device_mesh(device, (W,))`, `set_requires_gradient_sync(last)` per micro-batch, AdamW,
clipping), unmodified for ddp-verify: one process trains the plain model on the same samples.

  python examples/fsdp2/train.py --grad-accum 4 --world 2              # one process, K=4
  torchrun --nproc_per_node 2 examples/fsdp2/train.py --grad-accum 4   # FSDP2, K/W=2 per rank
  ddp-verify --acc-steps 4 --gpus 2 -- python examples/fsdp2/train.py --grad-accum 4

Planted bugs and variants:
`--bug divide-factor-sum`: `set_gradient_divide_factor(1.0)`, the gradients summed over ranks,
  not averaged (pytorch#162338 did this silently on gloo).
`--bug sync-never-on`: `set_requires_gradient_sync(False)` for the first micro-batch and never
  set back, so no gradient is ever reduce-scattered.
`--always-sync`: no `set_requires_gradient_sync` at all: every micro-batch reduce-scatters
  (correct, K/W times the traffic: seed 002's slowdown).
`--bf16`: `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` in the FSDP2 leg
  (the one-process leg trains under CPU autocast to bfloat16, float32 weights and gradients).
`--no-reshard`: `fully_shard(reshard_after_forward=False)`, parameters kept gathered between
  forward and backward (ZeRO-2's trade).
`--lora`: PEFT's `inject_adapter_in_model(LoraConfig(...))` on the blocks' linears, everything
  else frozen and left out of the optimizer (peft needed: bench/sweep's venv has it).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d_in=12, d=32, classes=5, blocks=3):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="K: micro-batches per optimizer step over all ranks")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")),
                   help="one process: the world whose samples it replays")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=5.0, help="max_norm (5: clips none of these steps' norms)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: NCCL, one GPU per rank")
    p.add_argument("--always-sync", action="store_true")
    p.add_argument("--no-reshard", action="store_true", help="fully_shard(reshard_after_forward=False): ZeRO-2's way")
    p.add_argument("--lora", action="store_true", help="PEFT LoRA adapters on the blocks' linears, the rest frozen")
    p.add_argument("--bug", default=None, choices=["divide-factor-sum", "sync-never-on"])
    args = p.parse_args()

    sharded = int(os.environ.get("WORLD_SIZE", "1")) > 1
    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if sharded:
        dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size() if sharded else 1
    local = args.grad_accum // world
    torch.manual_seed(0)
    model = Net(d=args.width)
    if args.lora:
        from peft import LoraConfig, inject_adapter_in_model

        torch.manual_seed(2)  # the adapters' own draw, after the frozen model's
        model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["up", "down"]), model)
        for name, param in model.named_parameters():
            param.requires_grad_("lora_" in name)
    model = model.to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 12, generator=g)
    y = torch.randint(0, 5, (args.samples,), generator=g)
    dataset = TensorDataset(x, y)
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else MixedPrecisionPolicy()
        for b in model.blocks:
            fully_shard(b, mesh=mesh, mp_policy=mp, reshard_after_forward=not args.no_reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=not args.no_reshard)
        if args.bug == "divide-factor-sum":
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_gradient_divide_factor(1.0)
                    # gloo has no PREMUL_SUM: a plain sum, then the (non-)division.
                    m.set_force_sum_reduction_for_comms(not cuda)
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)
    else:
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=args.batch, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
        local = args.grad_accum
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.01)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(len(loader) // local):
            for micro in range(local):
                xb, yb = (t.to(device) for t in next(batches))
                if sharded and not args.always_sync:
                    if args.bug == "sync-never-on":
                        if micro == 0:
                            model.set_requires_gradient_sync(False)
                    else:
                        model.set_requires_gradient_sync(micro == local - 1)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16 and not sharded):
                    loss = nn.functional.cross_entropy(model(xb), yb) / local
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad()
    if sharded:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
