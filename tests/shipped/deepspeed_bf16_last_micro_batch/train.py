"""DeepSpeed's BF16_Optimizer (bf16 model, fp32 gradient accumulation, ZeRO stage 1) all-reduces
the accumulated gradients before it adds the last micro-batch's (DeepSpeed 0.18.5, which first
picks BF16_Optimizer for this configuration, to 0.18.9; fixed in 0.19.0).

Tracker: https://github.com/deepspeedai/DeepSpeed/pull/7985
Buggy: deepspeed 0.18.6. Fixed: deepspeed 0.19.8 (the project's; first fixed release 0.19.0).

Mechanism: `DeepSpeedEngine._backward_epilogue` ran `allreduce_gradients()` before
`optimizer.backward_epilogue()`. BF16_Optimizer (without `immediate_grad_update`) adds each
micro-batch's bf16 gradient into its fp32 accumulator only in `backward_epilogue`, and the
all-reduce reduces that same accumulator, so on the window's last micro-batch the average over
ranks is taken of the earlier micro-batches only and each rank then adds its own last
micro-batch unreduced: the step's gradient is avg(micro-batches 1..K/W-1) + this rank's last.
One process has nothing to reduce and gets the whole sum; W ranks part from it by
(W-1)/W of a micro-batch's share.

An ordinary DeepSpeed loop (`deepspeed.initialize` with AdamW, `"bf16": {"enabled": true}`,
`"data_types": {"grad_accum_dtype": "fp32"}`, ZeRO stage 1, gradient_accumulation_steps = the
micro-batches per rank, engine.backward and engine.step each micro-batch), a tiny MLP, 16
samples, 2 optimizer steps; the one-process leg deals the samples as W ranks'
DistributedSampler would (`AccumulationBatchSampler`):

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/deepspeed_bf16_last_micro_batch/train.py --grad-accum {acc_steps}
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
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))).float(), y)


def main():
    args, ddp, world, local, model, sampler, loader, deepspeed = _deepspeed_mlp.start(MLP)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": local,
        "train_batch_size": 2 * local * world,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 1},
        "gradient_clipping": args.clip,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    sampler.set_epoch(0)
    for x, y in loader:
        loss = engine(x.to(torch.bfloat16), y)
        engine.backward(loss)
        engine.step()  # steps the optimizer at DeepSpeed's accumulation boundary only
    engine.destroy()
    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
