"""Transformers' Trainer normalises each rank's loss by that rank's own token count under DDP
by default, so W ranks weigh their tokens unlike one process accumulating the same batches
(Transformers 4.46 to 4.53, `average_tokens_across_devices=False` by default; from 4.54 on by
default True).

Tracker: https://github.com/huggingface/transformers/issues/34242 (the option came with
https://github.com/huggingface/transformers/pull/34373, off by default; 4.54.0 turned it on by
default with https://github.com/huggingface/transformers/pull/39395).
Buggy: transformers 4.48.3. Fixed: transformers 4.54.0.

Mechanism: since 4.46 Trainer divides a causal LM's summed token loss by the number of label
tokens in the whole accumulation window (num_items_in_batch), which makes K micro-batches of
one process one big batch. Under DDP each rank counted only its own window's tokens, and DDP
then averages the ranks' gradients: (s_0/n_0 + s_1/n_1)/2 instead of (s_0+s_1)/(n_0+n_1),
which differ whenever the ranks' windows hold different numbers of tokens (sequences of
varying length, padding masked with -100). `average_tokens_across_devices=True` gathers the
count over ranks and multiplies the loss by W; 4.54.0 made it the default.

An ordinary Trainer run of a tiny Llama built from a config (no download; it takes the loss
kwargs, so Trainer passes num_items_in_batch), 16 sequences of 4 to 16 tokens, batch 2, 2
optimizer steps, DDP on gloo:

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/transformers_ddp_token_count/train.py --grad-accum {local_acc_steps}
"""
import argparse
import os

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--out", default="out/shipped-transformers-ddp-token-count")
    args = p.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=2, gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=1, learning_rate=1e-3, lr_scheduler_type="constant", optim="adamw_torch",
        weight_decay=0.01, max_grad_norm=1.0, seed=0, data_seed=0, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    Trainer(model=model, args=targs, train_dataset=Lengths(), data_collator=collate).train()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
