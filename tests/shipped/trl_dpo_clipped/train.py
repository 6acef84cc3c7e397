"""TRL's DPOTrainer under Transformers 4.48: its loss is never divided by
gradient_accumulation_steps, and gradient clipping is active in one run only (one process's
gradient, K times the mean's, is over max_grad_norm; each rank's, K/W times, is under it).

Tracker: https://github.com/huggingface/transformers/pull/35651 (4.48: Trainer divides only
where the model takes no loss kwargs; a causal LM takes **kwargs, and DPO's batches have no
`labels`, so num_items_in_batch is None and nothing divides). From 4.53.0 Trainer divides where
num_items_in_batch is None; TRL later set `model_accepts_loss_kwargs = False` in DPOTrainer
itself (https://github.com/huggingface/trl/pull/5710).
Buggy: trl 0.13.0 with transformers 4.48.3. Fixed: trl 0.13.0 with transformers 4.54.0.

Mechanism: the script is DPO as TRL's docs show it (a tiny Llama from a config and a word-level
tokenizer built here, no download). Trainer's training_step hands DPO's per-micro-batch mean
loss to accelerator.backward undivided. Clipping at 2.0 cuts one process's gradient (about
3.0) and leaves each rank's (about 1.5), so the applied gradients differ by the clip, not by
the missing factor's 2x: the direction must come from the recorded scaling, not the gradients.

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/trl_dpo_clipped/train.py --grad-accum {local_acc_steps}
"""
import argparse
import os

import torch
import torch.distributed as dist
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "yes", "no", "good", "bad"]


def tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


def preferences(n):
    g = torch.Generator().manual_seed(0)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for i in range(n):
        length = int(torch.randint(2, 6, (1,), generator=g))
        rows["prompt"].append(" ".join(WORDS[int(j)] for j in torch.randint(0, 8, (length,), generator=g)))
        rows["chosen"].append(" good yes" if i % 2 else " yes")
        rows["rejected"].append(" bad no" if i % 3 else " no")
    return Dataset.from_dict(rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--clip", type=float, default=2.0, help="max_grad_norm")
    p.add_argument("--out", default="out/shipped-trl-dpo-clipped")
    args = p.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(WORDS) + 3, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=1))
    cfg = DPOConfig(
        output_dir=args.out, per_device_train_batch_size=2, gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=1, learning_rate=1e-3, lr_scheduler_type="constant", max_grad_norm=args.clip,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True, seed=0, data_seed=0,
        dataloader_num_workers=0, disable_tqdm=True, max_length=32, max_prompt_length=16,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    DPOTrainer(model=model, args=cfg, train_dataset=preferences(16), processing_class=tokenizer()).train()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
