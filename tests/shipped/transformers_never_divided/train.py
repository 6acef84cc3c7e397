"""Transformers' Trainer never divides the loss by gradient_accumulation_steps where the model's
forward takes **kwargs but the batch has no `labels` (so num_items_in_batch is None, and the
model's own per-micro-batch mean loss is handed to backward as it is): each micro-batch counts K
times, K/W times on each rank.

Tracker: https://github.com/huggingface/transformers/pull/35651 (4.48: Trainer divides only
where the model takes no loss kwargs and no compute_loss_func is given); from 4.53.0 Trainer also
divides where num_items_in_batch is None (`training_step`: `(not self.model_accepts_loss_kwargs
or num_items_in_batch is None)`).
Buggy: transformers 4.48.3. Fixed: transformers 4.54.0.

Mechanism: Trainer asks whether the model consumes loss kwargs from its forward's signature
(a `**kwargs` says yes), and then leaves the division over the window to num_items_in_batch,
which it counts from the batch's `labels` only. A regression model whose targets are named
otherwise returns the mean over its micro-batch, and 4.48 hands it to accelerator.backward
undivided. The script is ordinary: it returns the mean loss, as Trainer's docs ask.

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/transformers_never_divided/train.py --grad-accum {local_acc_steps}

With `--samples 28 --batch {batch}` (cases.toml's transformers-short-window-divided-by-k) the
same script shows another bug of Trainer's: an epoch of 28 samples in micro-batches of 2 ends in
a window of 2 micro-batches where K=4, and Transformers 4.54.0 still divides each of its losses
by gradient_accumulation_steps (`loss / self.args.gradient_accumulation_steps`), so that window
trains at half its samples' mean (tracker: https://github.com/huggingface/transformers/issues/38837);
from 4.55.0 Trainer divides by the micro-batches the window holds
(`current_gradient_accumulation_steps`).

With `--plain-forward` (a forward without **kwargs, which Trainer divides itself) under
Transformers 4.51.3 (cases.toml's transformers-epoch-cut-short): Trainer plans max_steps from the
loader's 14 batches rounded down to 3 whole windows of 4, and stops before the epoch's last 2
batches, which a run without accumulation trains (fixed in 4.52.0 by
https://github.com/huggingface/transformers/pull/37923, which rounds up). DDP and accumulation agree; the big batch (`{batch}`
= K·B, one process, no accumulation) shows it, and `watch` from one run.
"""
import argparse
import os

import torch
import torch.distributed as dist
from transformers import Trainer, TrainingArguments


class Rows(torch.utils.data.Dataset):
    """A regression set: inputs and targets (not `labels`)."""

    def __init__(self, n=32, width=8):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, width, generator=g)
        self.y = self.x @ torch.randn(width, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "targets": self.y[i]}


class Regressor(torch.nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def forward(self, inputs, targets=None, **kwargs):
        out = self.net(inputs)
        loss = None if targets is None else torch.nn.functional.mse_loss(out, targets)
        return {"loss": loss, "logits": out}


class PlainRegressor(Regressor):
    """The same model whose forward takes no loss kwargs: Trainer divides its loss itself."""

    def forward(self, inputs, targets=None):
        return super().forward(inputs, targets)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="micro-batches per optimizer step in this process")
    p.add_argument("--out", default="out/shipped-transformers-never-divided")
    p.add_argument("--samples", type=int, default=32, help="samples in the epoch")
    p.add_argument("--batch", type=int, default=2, help="micro-batch size per process")
    p.add_argument("--plain-forward", action="store_true", help="a forward without **kwargs")
    args = p.parse_args()
    torch.manual_seed(0)
    targs = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=args.batch, gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=1, learning_rate=1e-2, lr_scheduler_type="constant", optim="adamw_torch",
        weight_decay=0.0, max_grad_norm=0.0, seed=0, data_seed=0, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        remove_unused_columns=False,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    Trainer(model=PlainRegressor() if args.plain_forward else Regressor(), args=targs, train_dataset=Rows(args.samples)).train()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
