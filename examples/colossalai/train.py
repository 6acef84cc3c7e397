"""Colossal-AI's gradient-accumulation loop, as its documentation writes it (Booster,
TorchDDPPlugin, `booster.no_sync(model, optimizer)` on every micro-batch but the last of a
step, the loss divided by the accumulation size, the optimizer stepped on the boundary), on a
small MLP over deterministic data, unmodified for ddp-verify: it takes K in all
(`--grad-accum`, divided by the world size inside) and records nothing itself.

  torchrun --nproc_per_node 1 examples/colossalai/train.py --grad-accum 4 --world 2  # one process, K=4
  torchrun --nproc_per_node 2 examples/colossalai/train.py --grad-accum 4            # DDP, K/W=2 per rank
  ddp-verify --acc-steps 4 --gpus 2 -- .venv-torch25/bin/torchrun examples/colossalai/train.py --grad-accum {acc_steps}

Colossal-AI 0.5.0 pins torch<=2.5.1 and Transformers 4.51.3, so it runs from its own
virtualenv (`scripts/setup-torch25.sh` makes `.venv-torch25`). Plain `python train.py` runs
too: the torchrun variables `colossalai.launch_from_torch` reads are set to a world of one.

On a CPU: Colossal-AI picks its accelerator itself (CUDA, else NPU, else CPU), and on the CPU
it takes gloo whatever backend is asked (`launch(backend=...)` is overridden by the
accelerator's), so nothing is needed but a machine without a visible GPU. TorchDDPPlugin
lists only cuda and npu as its devices, yet its `configure` moves the model to
`get_current_device()`, the CPU here, and wraps it in torch's DDP, which runs on gloo.
GeminiPlugin and LowLevelZeroPlugin do not run on a CPU (`--plugin gemini|low-level-zero`
shows their errors; see docs/colossalai.md).

The one-process leg (a world of one) replays the DDP ranks' samples with ddp_verify_trace's
AccumulationBatchSampler, as `plugin.prepare_dataloader`'s DistributedSampler (shuffle, seed
0) deals them; the DDP leg uses `prepare_dataloader` itself.

`--bug loss-not-divided`: the loss not divided by the accumulation size (loss scaling).
`--bug step-condition`: the documentation's own step condition, `idx % (K - 1) == 0` with K
the per-process accumulation size, for the honest `(idx + 1) % K == 0`: the optimizer steps
on the wrong micro-batches (step count).
"""
import argparse
import os
import socket

# colossalai.launch_from_torch reads torchrun's variables; plain `python train.py` is a world of one.
if "RANK" not in os.environ:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

import colossalai
import torch
import torch.distributed as dist
import torch.nn as nn
from colossalai.booster import Booster
from colossalai.booster.plugin import GeminiPlugin, LowLevelZeroPlugin, TorchDDPPlugin
from torch.utils.data import DataLoader, TensorDataset

from ddp_verify_trace import AccumulationBatchSampler

PLUGINS = {
    "torch-ddp": lambda: TorchDDPPlugin(),
    "gemini": lambda: GeminiPlugin(enable_gradient_accumulation=True),
    "low-level-zero": lambda: LowLevelZeroPlugin(stage=1),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4, help="K: micro-batches per optimizer step over all ranks")
    p.add_argument("--world", type=int, default=int(os.environ.get("DDP_VERIFY_WORLD", "2")),
                   help="one process: the DDP world whose samples it replays")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--samples", type=int, default=48)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--plugin", default="torch-ddp", choices=sorted(PLUGINS))
    p.add_argument("--bug", default=None, choices=["loss-not-divided", "step-condition"])
    args = p.parse_args()

    colossalai.launch_from_torch(seed=0, verbose=False)
    world = dist.get_world_size()
    ddp = world > 1
    local = args.grad_accum // world  # GRADIENT_ACCUMULATION in the documentation: per process

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(args.samples, 8, generator=g), torch.randint(0, 4, (args.samples,), generator=g))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    plugin = PLUGINS[args.plugin]()
    booster = Booster(plugin=plugin)
    if ddp:
        loader = plugin.prepare_dataloader(dataset, batch_size=args.batch, shuffle=True)
        sampler = loader.sampler
    else:
        sampler = AccumulationBatchSampler(len(dataset), world=args.world, batch_size=args.batch, shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_sampler=sampler)
    model, optimizer, criterion, loader, _ = booster.boost(
        model=model, optimizer=optimizer, criterion=criterion, dataloader=loader
    )

    divisor = 1 if args.bug == "loss-not-divided" else local
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        optimizer.zero_grad()
        for idx, (x, y) in enumerate(loader):
            if args.bug == "step-condition":
                boundary = idx % max(local - 1, 1) == 0
            else:
                boundary = (idx + 1) % local == 0
            if not boundary:
                with booster.no_sync(model, optimizer):
                    loss = criterion(model(x), y) / divisor
                    booster.backward(loss, optimizer)
            else:
                loss = criterion(model(x), y) / divisor
                booster.backward(loss, optimizer)
                optimizer.step()
                optimizer.zero_grad()
    dist.barrier()
    del model, optimizer, booster, plugin
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
