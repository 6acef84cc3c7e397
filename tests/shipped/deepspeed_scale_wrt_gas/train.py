"""DeepSpeed 0.18.3 divides every gradient by gradient_accumulation_steps even when the caller
says not to (`engine.backward(loss, scale_wrt_gas=False)`, which Transformers' Trainer passes
since it normalises the loss over the accumulation window itself).

Tracker: https://github.com/deepspeedai/DeepSpeed/pull/7724 (reported in
https://github.com/huggingface/accelerate/issues/3877; the hook came with
https://github.com/deepspeedai/DeepSpeed/pull/7665).
Buggy: deepspeed 0.18.3. Fixed: deepspeed 0.18.6 (first fixed release 0.18.4).

Mechanism: 0.18.3's PyTorch-style backward (PR 7665) registers a hook on each tensor the
engine's forward returns that divides its gradient by gradient_accumulation_steps
(`_backward_prologue_per_tensor`) whatever `scale_wrt_gas` says; `scale_wrt_gas=False` only
changed the loss it returns. Trainer already divides by the window's token count
(num_items_in_batch), so the gradients are divided again, and twice for a model that returns
its logits beside the loss (the loss's gradient passes through both hooks): by K^2=16 in one
process, by (K/W)^2=4 on each rank, and the runs part by a factor W^2=4.

An ordinary Trainer run of a tiny GPT-2 built from a config (no download) under DeepSpeed ZeRO
stage 2, the batch sizes, accumulation and clipping left to Trainer ("auto"), 16 sequences of
varying lengths, 2 optimizer steps:

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/deepspeed_scale_wrt_gas/train.py --grad-accum {local_acc_steps}
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Lengths(torch.utils.data.Dataset):
    def __init__(self, n=16, vocab=64, longest=16):
        g = torch.Generator().manual_seed(1)
        self.rows = []
        for _ in range(n):
            length = int(torch.randint(4, longest + 1, (1,), generator=g))
            self.rows.append(torch.randint(0, vocab, (length,), generator=g))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i]}


def collate(rows):
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    labels = torch.full((len(rows), longest), -100)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], labels[i, :n], mask[i, :n] = r["input_ids"], r["input_ids"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def deepspeed_config(stage):
    """ZeRO with what Trainer fills in ("auto"); one process sets the rendezvous DeepSpeed wants."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    import deepspeed.ops

    # DeepSpeed JIT-builds its shared-memory comm op (inference only) at init on CPUs otherwise.
    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    return {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--stage", type=int, default=2, choices=[1, 2, 3])
    p.add_argument("--out", default="out/shipped-deepspeed-scale-wrt-gas")
    args = p.parse_args()
    ds = deepspeed_config(args.stage)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=2, gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=1, learning_rate=1e-3, lr_scheduler_type="constant", optim="adamw_torch",
        weight_decay=0.01, max_grad_norm=1.0, seed=0, data_seed=0, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None, deepspeed=ds,
    )
    Trainer(model=model, args=targs, train_dataset=Lengths(), data_collator=collate).train()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
