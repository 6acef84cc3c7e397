"""DeepSpeed ZeRO-1/2 with the optimizer offloaded to the CPU keeps only the last backward of an
optimizer step when the loop accumulates by hand (gradient_accumulation_steps=1, several
engine.backward calls per engine.step, the boundary marked with
`set_gradient_accumulation_boundary`) (DeepSpeed 0.18.3 to 0.18.9; fixed in 0.19.0).

Tracker: https://github.com/deepspeedai/DeepSpeed/pull/7981 (the pattern is DeepSpeed's
documented unmanaged accumulation, formalised by
https://github.com/deepspeedai/DeepSpeed/pull/7665).
Buggy: deepspeed 0.18.6. Fixed: deepspeed 0.19.8 (the project's; first fixed release 0.19.0).

Mechanism: `copy_grads_in_partition` stored the reduced gradient of a non-boundary backward in
its CPU accumulator only `if gradient_accumulation_steps > 1`; with 1 the earlier backwards'
gradients were never kept, and the boundary backward overwrote the fp32 gradient buffer with
its own. One process running K backwards per step keeps 1/K of the step's gradient (its last
micro-batch), W ranks running K/W keep W/K (each rank's last, averaged).

An ordinary DeepSpeed loop accumulating by hand (`deepspeed.initialize` with AdamW, ZeRO stage
2, `"offload_optimizer": {"device": "cpu"}`, `zero_force_ds_cpu_optimizer: false` to keep the
torch AdamW, gradient_accumulation_steps 1, each micro-batch's loss divided by the micro-batches
per rank, `set_gradient_accumulation_boundary(last)`, engine.backward each, engine.step after
the last), a tiny MLP, 16 samples, 2 optimizer steps; the one-process leg deals the samples as
W ranks' DistributedSampler would (`AccumulationBatchSampler`):

  ddp-verify --acc-steps 4 --gpus 2 -- PYTHON tests/shipped/deepspeed_offload_multi_backward/train.py --grad-accum {acc_steps}
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
        "gradient_accumulation_steps": 1,
        "train_batch_size": 2 * world,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "zero_force_ds_cpu_optimizer": False,
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    sampler.set_epoch(0)
    batches = iter(loader)
    for _ in range(len(loader) // local):
        for micro in range(local):
            x, y = next(batches)
            engine.set_gradient_accumulation_boundary(micro == local - 1)
            engine.backward(engine(x, y) / local)
        engine.step()
    engine.destroy()
    if ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
