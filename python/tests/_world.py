"""A real gloo world of processes for the tests that record DDP."""
import os
import socket
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def run_world(fn, world, *args):
    """Runs `fn(rank, world, *args)` in `world` processes joined in one gloo process group
    (`fn` at a module's top level, so the processes can import it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_member, args=(world, port, fn, args), nprocs=world, join=True)


def _member(rank, world, port, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        fn(rank, world, *args)
    finally:
        if dist.is_initialized():  # `fn` may have destroyed it itself
            dist.destroy_process_group()
