"""What recording the precision facts costs a training step: the recorder's only new work per
step is, at each outermost forward, reading autocast's state on the module's device
(`_outermost.autocast_of`) and noting it (`Watch.autocast_seen`, and the micro-batch's own
`Batches.precision`, which the step's one gather carries), and at each backward comparing its
root's dtype with the narrowest seen (`loss_dtype`); the GradScaler's scale is
taken out of the facts by the judge, not in the run. Times that work against one bf16-autocast
training step of a small model (the same tiny GPT block stack `examples/cuda_hardcoded` trains,
on the CPU), in one process, both medians over rounds, and prints their ratio (the issue's
budget: at most 1% of a step). The precision control is a leg of its own, run only where a
narrow dtype meets a divisor ratio no power of two: bench/control.py's kind of cost, not a
step's.

  .venv/bin/python bench/precision.py [--rounds N] [--micro K]

Last line: JSON."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from ddp_verify_trace._outermost import autocast_of  # noqa: E402
from ddp_verify_trace._watch import Watch  # noqa: E402


def model() -> nn.Module:
    layer = nn.TransformerEncoderLayer(32, 2, 128, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Embedding(32, 32), nn.TransformerEncoder(layer, 2), nn.Linear(32, 32))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--micro", type=int, default=4, help="micro-batches (outermost forwards) per step")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randint(32, (4, 16))
    steps, facts = [], []
    watch = Watch()
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        for _ in range(a.micro):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = m(x).float().logsumexp(-1).mean() / a.micro
            loss.backward()
        opt.step()
        opt.zero_grad()
        steps.append(time.perf_counter() - t0)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the step's own, not the facts' cost
            t0 = time.perf_counter()
            for _ in range(a.micro):
                dtype = autocast_of(m)
                watch.autocast_seen(dtype)
                watch.batches.precision(dtype)
                if watch.batches.loss_dtype is None or loss.dtype.itemsize < watch.batches.loss_dtype.itemsize:
                    watch.batches.loss_dtype = loss.dtype
            facts.append(time.perf_counter() - t0)
    step, fact = statistics.median(steps), statistics.median(facts)
    print(f"step {step * 1e3:.2f} ms, precision facts {fact * 1e6:.1f} us per step: {fact / step:.2e} of a step")
    print(json.dumps({"step_s": step, "facts_s": fact, "ratio": fact / step, "micro": a.micro}))


if __name__ == "__main__":
    main()
