"""The sweep's Hugging Face script (bench/sweep/run.py): Transformers' Trainer, TRL's SFTTrainer
and DPOTrainer, and PEFT's LoRA, each used as its docs show, on a tiny Llama built from a config
and a word-level tokenizer built here (no download). Unmodified for ddp-verify: K/W per process
comes in as `--grad-accum {local_acc_steps}`.

  ddp-verify --acc-steps 4 --gpus 2 -- python bench/sweep/scripts/hf.py --trainer sft --packing --grad-accum {local_acc_steps}

Features (each a library path that changed in the last year):
  --trainer trainer|sft|dpo     which trainer
  --packing / --padding-free    SFTConfig(packing=True) (its "bfd" packing) / padding_free=True
  --completion-only             SFT on prompt-completion rows: the loss on completions only
  --label-smoothing F           TrainingArguments(label_smoothing_factor=F) (Trainer's label smoother)
  --checkpointing               gradient_checkpointing=True
  --groups                      two parameter groups of their own learning rates (optimizer_cls_and_kwargs)
  --lora                        peft.get_peft_model(LoraConfig(...)) before the trainer
  --no-average-tokens           average_tokens_across_devices=False (its default is True)
  --deepspeed STAGE             TrainingArguments(deepspeed=a ZeRO config of "auto"s)
  --bf16                        bf16=True (on the CPU, torch's bfloat16 autocast)
"""
import argparse
import copy
import importlib.util
import os

import torch
import torch.distributed as dist
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Trainer, TrainingArguments

# examples/transformers/train.py's collator (labels masked at the padding) and DeepSpeed config
# (Trainer's "auto"s, one process's rendezvous): the sweep's Trainer runs as that example does.
_spec = importlib.util.spec_from_file_location(
    "transformers_example", os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "transformers", "train.py"))
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
collate, deepspeed_config = _example.collate, _example.deepspeed_config

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "yes", "no", "good", "bad"]


def tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


def sentence(g, shortest, longest):
    length = int(torch.randint(shortest, longest + 1, (1,), generator=g))
    return " ".join(WORDS[int(j)] for j in torch.randint(0, len(WORDS), (length,), generator=g))


def texts(n):
    """Texts in pairs of 2..12 and 14 minus that many words: with EOS, 16 tokens a pair, so
    "bfd" packing into 16 fills every sequence whole (n/2 of them, as many as W·B·K divides)."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n // 2):
        a = int(torch.randint(2, 13, (1,), generator=g))
        rows += [sentence(g, a, a), sentence(g, 14 - a, 14 - a)]
    order = torch.randperm(len(rows), generator=g).tolist()
    return [rows[i] for i in order]


def prompt_completions(n):
    g = torch.Generator().manual_seed(0)
    rows = {"prompt": [], "completion": []}
    for _ in range(n):
        rows["prompt"].append(sentence(g, 2, 6))
        rows["completion"].append(" " + sentence(g, 1, 8))
    return rows


def preferences(n):
    g = torch.Generator().manual_seed(0)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for i in range(n):
        rows["prompt"].append(sentence(g, 2, 6))
        rows["chosen"].append(" good yes" if i % 2 else " yes")
        rows["rejected"].append(" bad no" if i % 3 else " no")
    return rows


def tokenized(tok, n):
    """Trainer's own rows: token ids of varying lengths, labels = ids (padding masked); a list
    is a map-style dataset (no `datasets` needed: CI's venv has Transformers alone)."""
    return [{"input_ids": torch.tensor(tok(t)["input_ids"])} for t in texts(n)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trainer", default="trainer", choices=["trainer", "sft", "dpo"])
    p.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step in this process")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--samples", type=int, default=48, help="rows (packed: 2 a sequence; DPO: 2 a pair)")
    p.add_argument("--packing", action="store_true")
    p.add_argument("--padding-free", action="store_true")
    p.add_argument("--completion-only", action="store_true")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--groups", action="store_true")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--no-average-tokens", action="store_true")
    p.add_argument("--deepspeed", type=int, default=None, choices=[1, 2, 3])
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--out", default="out/sweep-hf")
    args = p.parse_args()
    torch.manual_seed(0)
    tok = tokenizer()
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(WORDS) + 3, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=128, pad_token_id=0, bos_token_id=2, eos_token_id=1))
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj", "up_proj"]))
    common = dict(
        output_dir=args.out, per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=1, learning_rate=1e-3, lr_scheduler_type="constant", max_grad_norm=1.0, weight_decay=0.01,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, seed=0, data_seed=0,
        dataloader_num_workers=0, disable_tqdm=True, bf16=args.bf16, gradient_checkpointing=args.checkpointing,
        label_smoothing_factor=args.label_smoothing, average_tokens_across_devices=not args.no_average_tokens,
        deepspeed=deepspeed_config(args.deepspeed) if args.deepspeed else None,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    if args.groups:
        # Two groups of their own learning rates: the embeddings slower than the rest.
        slow = [p for n, p in model.named_parameters() if "embed" in n and p.requires_grad]
        rest = [p for n, p in model.named_parameters() if "embed" not in n and p.requires_grad]
        groups = [{"params": slow, "lr": 1e-4}, {"params": rest, "lr": 1e-3, "weight_decay": 0.01}]
        common["optimizers"] = (torch.optim.AdamW(groups, lr=1e-3), None)
    optimizers = common.pop("optimizers", (None, None))
    if args.trainer == "trainer":
        trainer = Trainer(model=model, args=TrainingArguments(**common), train_dataset=tokenized(tok, args.samples),
                          data_collator=collate, optimizers=optimizers)
    elif args.trainer == "sft":
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer

        # Packed into 16 tokens (texts() pairs fill each whole); padding-free enforces no
        # max_length without packing (TRL refuses one).
        longest = 16 if args.packing else None if args.padding_free else 32
        cfg = SFTConfig(**common, packing=args.packing, padding_free=args.padding_free, max_length=longest,
                        completion_only_loss=True if args.completion_only else None)
        rows = prompt_completions(args.samples) if args.completion_only else {"text": texts(args.samples)}
        data = Dataset.from_dict(rows)
        trainer = SFTTrainer(model=model, args=cfg, train_dataset=data, processing_class=tok, optimizers=optimizers)
    else:
        from datasets import Dataset
        from trl import DPOConfig, DPOTrainer

        cfg = DPOConfig(**common, max_length=32, padding_free=args.padding_free)
        # A model built from a config has no path to load the reference from: a copy of it.
        trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=cfg,
                             train_dataset=Dataset.from_dict(preferences(args.samples // 2)), processing_class=tok,
                             optimizers=optimizers)
    trainer.train()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
