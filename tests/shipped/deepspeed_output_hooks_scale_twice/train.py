"""DeepSpeed divides the gradient by gradient_accumulation_steps once per tensor its forward
returns, so a model that returns its loss beside the predictions it was computed from (a dict
of tensors, as Hugging Face models return) gets gradients divided by it twice (DeepSpeed 0.18.3
to 0.19.5, by the source; fixed in 0.19.6).

Tracker: https://github.com/deepspeedai/DeepSpeed/pull/8245 (engine.backward scales the whole
loss itself and marks its graph, so the output hooks no longer scale; the hooks came with
https://github.com/deepspeedai/DeepSpeed/pull/7665).
Buggy: deepspeed 0.18.6. Fixed: deepspeed 0.19.8 (the project's; first fixed release 0.19.6).

Mechanism: since 0.18.3 the engine's forward registers a backward hook on every tensor of its
output (`register_output_backward_hooks`), each dividing the gradient that passes it by
gradient_accumulation_steps, and `engine.backward(loss)` leaves the loss unscaled for them.
The loss's gradient passes the loss's hook and then the predictions' hook: divided by GAS^2,
K^2 in one process and (K/W)^2 on each rank, so the runs part by a factor W.

An ordinary DeepSpeed loop (`deepspeed.initialize` with AdamW, ZeRO stage 2,
gradient_accumulation_steps = the micro-batches per rank, `engine(x, y)["loss"]`,
engine.backward and engine.step each micro-batch), a tiny MLP returning {"loss", "pred"}, 16
samples, 2 optimizer steps; the one-process leg deals the samples as W ranks'
DistributedSampler would (`AccumulationBatchSampler`):

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/deepspeed_output_hooks_scale_twice/train.py --grad-accum {acc_steps}
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _deepspeed_mlp  # noqa: E402  (tests/shipped/: what the DeepSpeed MLP scripts share)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x, y):
        pred = self.fc2(F.gelu(self.fc1(x)))
        return {"loss": F.mse_loss(pred, y), "pred": pred}


def main():
    args, ddp, world, local, model, sampler, loader, deepspeed = _deepspeed_mlp.start(MLP)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": local,
        "train_batch_size": 2 * local * world,
        "zero_optimization": {"stage": 2},
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    sampler.set_epoch(0)
    for x, y in loader:
        loss = engine(x, y)["loss"]
        engine.backward(loss)
        engine.step()  # steps the optimizer at DeepSpeed's accumulation boundary only
    engine.destroy()
    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
