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
import argparse
import logging
import os
import socket

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(F.gelu(self.fc1(x))).float(), y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="K: micro-batches per optimizer step over all ranks")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")),
                   help="one process: the DDP world whose samples it replays")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    args = p.parse_args()
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if not ddp:  # what deepspeed.init_distributed needs for a world of one without a launcher
        for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    import deepspeed
    import deepspeed.ops

    # DeepSpeed JIT-builds its shared-memory comm op (inference only) at init on CPUs otherwise.
    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    deepspeed.utils.logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    world = int(os.environ["WORLD_SIZE"])
    local = args.grad_accum // world
    torch.manual_seed(0)
    model = MLP()
    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(args.samples, 8, generator=g), torch.randn(args.samples, 4, generator=g))
    if ddp:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    else:
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=2, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": local,
        "train_batch_size": 2 * local * world,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "fp32"},
        "zero_optimization": {"stage": 1},
        "gradient_clipping": 0.0,
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
