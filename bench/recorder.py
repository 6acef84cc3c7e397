"""The recorder's cost per training step, on this machine's CPU (one process, one thread).

  .venv/bin/python bench/recorder.py [--steps N]

For resnet18 (torchvision, 64x64 images, micro-batches of 8) and a GPT-2-sized transformer
block (768 wide, 12 heads, 128 tokens, micro-batches of 4), each step K=2 micro-batches with
AdamW: the median step time without the recorder, then with `record()` as it is by default
(magnitudes per tensor: one read pass per backward), without magnitudes, and with them per
element (a copy per backward), each as a ratio to the first, in wall time and in the training
thread's CPU time (steadier on a loaded machine). Target: the default costs at
most 5% of a step; per-element magnitudes may cost more. (Under DDP the recorder also makes one small all_gather and one all_reduce of
the magnitudes per step; not measured here.)
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "nanogpt"))
import ddp_verify_trace  # noqa: E402
from train import Block  # noqa: E402  (the nanoGPT example's block)


def resnet18():
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(8, 3, 64, 64, generator=g), torch.randint(0, 10, (8,), generator=g))
    return model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1])


def gpt2_block():
    model = nn.Sequential(Block(768, 12))
    g = torch.Generator().manual_seed(0)
    batch = torch.randn(4, 128, 768, generator=g)
    return model, batch, lambda m, b: m(b).square().mean()


def median_step(make, steps, record=None):
    torch.manual_seed(0)
    model, batch, loss_of = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    session = None
    with tempfile.TemporaryDirectory() as d:
        if record is not None:
            how = None if record == "default" else record
            session = ddp_verify_trace.record(os.path.join(d, "t.safetensors"), magnitudes=how)
        times, cpu = [], []
        for s in range(steps + 1):
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(2):
                (loss_of(model, batch) / 2).backward()
            opt.step()
            opt.zero_grad()
            if s:  # the first step warms up (and finds the model, once)
                times.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
        if session is not None:
            session.close()
    return statistics.median(times), statistics.median(cpu)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"recorder overhead per step, median of {args.steps} steps (K=2, AdamW, one thread)")
    print("wall: the step's time; cpu: the training thread's CPU time (the writer thread, which")
    print("streams the trace to disk and tracks peaks on another core, not counted)")
    variants = ["default", False, "element"]
    print(f"{'model':<12} {'':>4} {'no recorder':>12}" + "".join(f" {str(v):>10} {'ratio':>6}" for v in variants))
    for name, make in [("resnet18", resnet18), ("gpt2-block", gpt2_block)]:
        # Rounds alternate the variants, and each keeps its fastest round's median: a machine's
        # background load then slows every variant alike instead of the one measured last.
        rounds = [[median_step(make, args.steps, record=r) for r in [None] + variants] for _ in range(args.rounds)]
        for k, clock in enumerate(["wall", "cpu"]):
            base, *rest = (min(r[i][k] for r in rounds) for i in range(len(variants) + 1))
            row = "".join(f" {t * 1e3:>8.1f}ms {t / base:>6.3f}" for t in rest)
            print(f"{name if not k else '':<12} {clock:>4} {base * 1e3:>10.1f}ms" + row)


if __name__ == "__main__":
    main()
