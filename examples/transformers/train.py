"""A Transformers Trainer run of a tiny GPT-2 built from a config (no download), on sequences
of varying lengths, unmodified for ddp-verify: K/W per process comes in as an argument.

  ddp-verify --acc-steps 4 --gpus 2 --batch-size 2 -- python examples/transformers/train.py --grad-accum {local_acc_steps} --batch {batch}

With `--batch {batch}` the script also runs as one big batch of each step's K·B samples (one
process, no accumulation), the third trace.

Trainer deals whole batches to the processes round robin (Accelerate's BatchSamplerShard), so
one process accumulating K batches sees exactly the samples of W processes accumulating K/W.

`--bug mean-per-micro-batch` overrides compute_loss with the model's own mean over each
micro-batch's tokens, dropping num_items_in_batch (Transformers PR 34191's class): accumulation
and DDP agree, as both average per micro-batch, and only the big batch shows it.
`--dropout 0.1` (GPT-2's default) trains with dropout on: the runs draw their own masks and
cannot agree, and the report says so before anything finer.
`--bug divide-by-accumulation` overrides compute_loss to divide the loss by
gradient_accumulation_steps itself, as hand-written loops do: Trainer already normalises
over the accumulation window (num_items_in_batch), so the loss is divided by K in one process
and by K/W under DDP, and the runs part by a factor W.
`--deepspeed STAGE` trains under DeepSpeed ZeRO stage 1, 2 or 3 (TrainingArguments(deepspeed=
a config whose batch sizes, accumulation and clipping Trainer fills in: "auto")); one process
sets the rendezvous DeepSpeed wants itself, as examples/deepspeed/train.py does.
`--bf16` sets TrainingArguments(bf16=True): Trainer's bfloat16 autocast (on the CPU, torch's).
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Lengths(torch.utils.data.Dataset):
    def __init__(self, n=32, vocab=64, longest=16):
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


class MeanPerMicroBatch(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs)
        loss = out.loss / self.args.gradient_accumulation_steps
        return (loss, out) if return_outputs else loss


class DividesByAccumulation(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, out = super().compute_loss(model, inputs, True, num_items_in_batch)
        loss = loss / self.args.gradient_accumulation_steps
        return (loss, out) if return_outputs else loss


def deepspeed_config(stage):
    """A ZeRO config Trainer completes from its own arguments ("auto"), DeepSpeed made ready
    for one process and for CPUs: what examples/deepspeed/train.py does, see there."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    import deepspeed.ops

    # The shared-memory comm op (inference only) is JIT-built at init_distributed otherwise.
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
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step in this process")
    p.add_argument("--batch", type=int, default=2, help="micro-batch size")
    p.add_argument("--samples", type=int, default=32, help="N: sequences in the data set")
    p.add_argument("--out", default="out/transformers-example")
    p.add_argument("--bug", default=None, choices=["divide-by-accumulation", "mean-per-micro-batch"])
    p.add_argument("--dropout", type=float, default=0.0, help="GPT-2's own default is 0.1")
    p.add_argument("--deepspeed", type=int, default=None, choices=[1, 2, 3], help="DeepSpeed ZeRO stage")
    p.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True): bfloat16 autocast")
    args = p.parse_args()
    ds = deepspeed_config(args.deepspeed) if args.deepspeed else None
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=args.dropout,
                        embd_pdrop=args.dropout, attn_pdrop=args.dropout)
    model = GPT2LMHeadModel(config)
    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=1, learning_rate=1e-3, lr_scheduler_type="constant", optim="adamw_torch",
        weight_decay=0.01, max_grad_norm=1.0, seed=0, data_seed=0, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None, deepspeed=ds, bf16=args.bf16,
    )
    cls = {"divide-by-accumulation": DividesByAccumulation, "mean-per-micro-batch": MeanPerMicroBatch}.get(args.bug, Trainer)
    cls(model=model, args=targs, train_dataset=Lengths(args.samples), data_collator=collate).train()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
