r"""A nanoGPT-style loop that hard-codes CUDA and NCCL, as nanoGPT's train.py does: under
torchrun `device = f"cuda:{ddp_local_rank}"`, `torch.cuda.set_device(device)`,
`init_process_group(backend="nccl")`, `DDP(model, device_ids=[ddp_local_rank])`, batches
pinned and moved with `.to(device, non_blocking=True)`, bfloat16 autocast on "cuda" and a
GradScaler enabled for float16 only. A tiny GPT (attention with `dropout_p`, dropout layers:
nanoGPT's default of 0 unless `--dropout`) on synthetic tokens, seeded, AdamW, gradient
clipping, 6 optimizer steps in seconds.

Unmodified for ddp-verify, on a machine with no GPU: `--device cpu` has the recorder run its
CUDA on the CPU and NCCL as gloo (and say what it mapped in the trace's header). With
`--dropout 0.1` one process and the ranks draw other masks, which the report names;
`--no-dropout` makes the dropout the identity, so the rest of the loop is checked:

  ddp-verify --acc-steps 4 --gpus 2 --device cpu -- torchrun --nproc-per-node 2 examples/cuda_hardcoded/train.py --grad-accum {local_acc_steps}
  ddp-verify --acc-steps 4 --gpus 2 --device cpu --no-dropout -- torchrun --nproc-per-node 2 examples/cuda_hardcoded/train.py --grad-accum {local_acc_steps} --dropout 0.1

By hand, without ddp-verify (the recorder's sitecustomize on the path, as ddp-verify puts it):

  PYTHONPATH=python/ddp_verify_trace/autoload:python DDP_VERIFY_DEVICE=cpu DDP_VERIFY_TRACE=/tmp/t.safetensors \
      torchrun --nproc-per-node 2 examples/cuda_hardcoded/train.py --grad-accum 2

It asserts CUDA before anything (`torch.cuda.is_available()`, `device_count()`), as timm's
train.py does: under `--device cpu` the recorder answers those as its mapping implies.

`--grad-accum` is this process's micro-batches per optimizer step (K in one process, K/W on
each of W ranks). Each step's K·B sequences are drawn from a generator seeded by the step,
and rank r takes the step's micro-batches r·K/W .. (r+1)·K/W - 1, a contiguous deal: one
process with K micro-batches sees the very samples W ranks see with K/W each.
"""
import argparse
import math
import os
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.resid_dropout = nn.Dropout(dropout)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        x = x + self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d)))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, d, heads, layers, dropout):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.smoothing = 0.0

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        flat = logits.view(-1, logits.size(-1))
        return logits, F.cross_entropy(flat, targets.view(-1), label_smoothing=self.smoothing)


# Planted bugs, each done by the DDP leg alone (W > 1; the one process trains honestly).
BUGS = {
    "loss-x1.03": "each micro-batch's loss multiplied by 1.03 (a loss 'calibrated' on the ranks)",
    "label-smoothing": "cross-entropy with label_smoothing=0.1",
    "autocast-only": "autocast only here (the one process computes in float32)",
    "bf16-model": "the model cast to bfloat16 (model.to(torch.bfloat16)) before DDP wraps it",
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--batch", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dropout", type=float, default=0.0, help="nanoGPT's default for finetuning and small runs")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--comm-hook", choices=["bf16", "fp16"], help="DDP's bf16_compress_hook or fp16_compress_hook")
    p.add_argument(
        "--bug",
        choices=list(BUGS),
        help="a planted precision bug, under DDP only: " + "; ".join(f"{k}: {v}" for k, v in BUGS.items()),
    )
    args = p.parse_args()
    vocab, block = 32, 16

    # nanoGPT's set-up, CUDA and NCCL hard-coded; CUDA asserted first, as timm's train.py does.
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        raise SystemExit("CUDA is not available but cuda was specified")
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        init_process_group(backend="nccl")
        ddp_rank = int(os.environ["RANK"])
        ddp_local_rank = int(os.environ["LOCAL_RANK"])
        ddp_world_size = int(os.environ["WORLD_SIZE"])
        device = f"cuda:{ddp_local_rank}"
        torch.cuda.set_device(device)
        master_process = ddp_rank == 0
    else:
        ddp_rank, ddp_world_size, master_process = 0, 1, True
        device = "cuda"
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device_type = "cuda" if "cuda" in device else "cpu"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

    bug = args.bug if ddp_world_size > 1 else None
    if bug == "autocast-only":
        ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
    elif args.bug == "autocast-only":
        ctx = nullcontext()
    model = GPT(vocab, block, d=32, heads=2, layers=2, dropout=args.dropout)
    model.smoothing = 0.1 if bug == "label-smoothing" else 0.0
    model.to(device)
    if bug == "bf16-model":
        model.to(torch.bfloat16)
    scaler = torch.cuda.amp.GradScaler(enabled=(args.dtype == "float16"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    if ddp:
        model = DDP(model, device_ids=[ddp_local_rank])
        if args.comm_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
            model.register_comm_hook(None, hook[args.comm_hook])
    raw_model = model.module if ddp else model

    def get_batch(step, micro):
        # The step's K·B sequences, from a generator seeded by the step; this rank's micro-batches.
        total = args.grad_accum * ddp_world_size
        g = torch.Generator().manual_seed(1000 + step)
        data = torch.randint(vocab, (total * args.batch, block + 1), generator=g)
        i = ddp_rank * args.grad_accum + micro
        rows = data[i * args.batch : (i + 1) * args.batch]
        x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        if device_type == "cuda":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        else:
            x, y = x.to(device), y.to(device)
        return x, y

    for step in range(args.steps):
        lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        running = torch.zeros((), device=device)
        for micro_step in range(args.grad_accum):
            if ddp:
                model.require_backward_grad_sync = micro_step == args.grad_accum - 1
            X, Y = get_batch(step, micro_step)
            with ctx:
                logits, loss = model(X, Y)
                if bug == "loss-x1.03":
                    loss = loss * 1.03
                loss = loss / args.grad_accum
            running += loss.detach().float()
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if master_process:
            print(f"step {step}: loss {running.item():.4f} (this rank's micro-batches), lr {lr:.2e}")
    del raw_model
    if ddp:
        destroy_process_group()


if __name__ == "__main__":
    main()
