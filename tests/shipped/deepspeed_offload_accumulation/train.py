"""DeepSpeed ZeRO-1/2 with the optimizer offloaded to the CPU keeps only the first and the last
micro-batch of each accumulation window (DeepSpeed 0.15.2 to 0.18.9; fixed in 0.19.0).

Tracker: https://github.com/deepspeedai/DeepSpeed/pull/7967 (the bug came with
https://github.com/deepspeedai/DeepSpeed/pull/6550).
Buggy: deepspeed 0.18.6. Fixed: deepspeed 0.19.8 (the project's; first fixed release 0.19.0).

Mechanism: with `offload_optimizer`, each micro-batch's reduced gradient partition is added to
a CPU copy of the running sum (`async_accumulate_grad_in_cpu_via_gpu`): on micro-step 0 the
gradient is copied there, on later micro-steps the copy is added to the new gradient, but the
sum was never copied back, so the copy keeps micro-step 0's gradient alone and the boundary's
gradient is g_0 + g_last. Two micro-batches per rank (K/W=2) lose nothing; one process
accumulating K=4 loses micro-batches 1 and 2. (The PR's title speaks of the gradient norm,
the first symptom seen; the step's gradient is the same sum. 0.18.7 to 0.18.9 fail on torch
2.13 before the first step, with ZeRO-1/2 under DDP: fixed in 0.19.0 by PR 7948.)

An ordinary DeepSpeed loop (`deepspeed.initialize` with AdamW, ZeRO stage 2,
`"offload_optimizer": {"device": "cpu"}`, `zero_force_ds_cpu_optimizer: false` to keep the
torch AdamW, gradient_accumulation_steps = the micro-batches per rank, engine.backward and
engine.step each micro-batch), a tiny MLP, 16 samples, 2 optimizer steps; the one-process leg
deals the samples as W ranks' DistributedSampler would (`AccumulationBatchSampler`):

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/deepspeed_offload_accumulation/train.py --grad-accum {acc_steps}
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
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))), y)


def main():
    args, ddp, world, local, model, sampler, loader, deepspeed = _deepspeed_mlp.start(MLP)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": local,
        "train_batch_size": 2 * local * world,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    sampler.set_epoch(0)
    for x, y in loader:
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()  # steps the optimizer at DeepSpeed's accumulation boundary only
    engine.destroy()
    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
