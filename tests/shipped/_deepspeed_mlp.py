"""What the corpus's DeepSpeed MLP scripts share: their flags, DeepSpeed started on gloo (a
world of one without a launcher too), the model built after seed 0, and 16 samples dealt
as W ranks' DistributedSampler deals them: one process replays them with
`AccumulationBatchSampler`, or with `--loader plain` reads the sampler's permutation in
order from a plain DataLoader (the same samples per step, grouped otherwise into
micro-batches). Each script keeps its own config and loop."""
import argparse
import logging
import os
import socket

import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler


def start(make_model):
    """(args, ddp, world, local, model, sampler, loader, deepspeed): `local` micro-batches per
    rank and optimizer step."""
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="K: micro-batches per optimizer step over all ranks")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")),
                   help="one process: the DDP world whose samples it replays")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--loader", default="replay", choices=["replay", "plain"],
                   help="one process: AccumulationBatchSampler, or the permutation read in order")
    p.add_argument("--clip", type=float, default=0.0, help="the config's gradient_clipping")
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
    model = make_model()
    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(args.samples, 8, generator=g), torch.randn(args.samples, 4, generator=g))
    if ddp:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=2, sampler=sampler)
    elif args.loader == "plain":
        sampler = _Epochs()
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
        loader = DataLoader(Subset(dataset, order), batch_size=2)
    else:
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=2, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
    return args, ddp, world, local, model, sampler, loader, deepspeed


class _Epochs:
    """A plain loader's stand-in for a sampler's set_epoch (one epoch is read)."""

    def set_epoch(self, epoch):
        pass
