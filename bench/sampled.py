"""Whole and sampled traces at the size people train: trace size, recording cost, `compare`.

  .venv/bin/python bench/sampled.py OUT_DIR [--layers 6] [--width 4096] [--steps 4]
                                            [--sample 1024] [--skip-whole] [--bin PATH]

A plain loop over `layers` Linear(width, width) (6 x 4096: 100.7M parameters; 60 x 4096: 1.007B),
batch 4, K=2 micro-batches per step, SGD without momentum (the optimizer that fits 1B float32
parameters in 24 GB). Each configuration trains `steps` optimizer steps twice, in turn: `a` adds
each step's micro-batches in order, `b` in reverse (so every gradient element differs by rounding,
as under DDP, and `compare` judges every element). Configurations: no recorder, `record()` whole
(skipped with --skip-whole), `record(sample=N)`.

Prints per configuration the median step time (the first step, which warms up, left out) and its
ratio to no recorder, and the trace's size; then `ddp-verify compare` (a release build:
target/release/ddp-verify, or --bin) on each pair, its wall time, peak RSS (GNU time) and exit
code (0: the reordered sums are judged EQUIVALENT).
The traces stay in OUT_DIR for timing `compare` by hand.
The last line is JSON with every number. Goals (issue 36): a sampled trace at most 1% of the
whole one, recording within 5% of a step, compare at >= 1 GB/s with under 1 GB of memory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn

import ddp_verify_trace

HERE = os.path.dirname(os.path.abspath(__file__))


def train(layers, width, steps, reverse, path=None, sample=None):
    """Median seconds per step after the first, training from seed 0."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    session = None
    if path is not None:
        kw = {"sample": sample} if sample else {"sample": "full"}
        session = ddp_verify_trace.record(path, overwrite=True, acc_steps=2, **kw)
    times = []
    for _ in range(steps):
        micro = [torch.randn(4, width, generator=g) for _ in range(2)]
        t0 = time.perf_counter()
        for x in reversed(micro) if reverse else micro:
            (model(x).square().mean() / 2).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if session is not None:
        session.close()
    del model, opt
    return statistics.median(times[1:]) if len(times) > 1 else times[0]


def compare(binary, a, b):
    """(seconds, peak RSS in MiB, exit code) of `ddp-verify compare a b`: GNU time's maximum
    resident set size (one process: bench/peak_rss.sh samples too slowly for a short one)."""
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", binary, "compare", a, b], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    rss = float(out.stderr.strip().split()[-1]) / 1024
    return seconds, rss, out.returncode


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--sample", type=int, default=1024)
    p.add_argument("--skip-whole", action="store_true")
    p.add_argument("--bin", default=os.path.join(HERE, "..", "target", "release", "ddp-verify"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    params = args.layers * (args.width * args.width + args.width)
    result = {"parameters": params, "steps": args.steps, "sample": args.sample, "torch": torch.__version__}
    shape = (args.layers, args.width, args.steps)
    base = train(*shape, reverse=False)
    result["step_s"] = {"none": base}
    print(f"{params / 1e6:.1f}M parameters, {args.steps} steps: {base:.3f} s/step without a recorder", flush=True)
    kinds = ([] if args.skip_whole else [("whole", None)]) + [("sampled", args.sample)]
    for kind, n in kinds:
        paths = [os.path.join(args.out, f"{kind}_{side}.safetensors") for side in "ab"]
        step = train(*shape, reverse=False, path=paths[0], sample=n)
        train(*shape, reverse=True, path=paths[1], sample=n)
        size = os.path.getsize(paths[0])
        seconds, rss, code = compare(args.bin, *paths)
        rate = 2 * size / seconds / 1e9
        result["step_s"][kind] = step
        result[kind] = {"bytes": size, "compare_s": seconds, "compare_peak_mib": rss, "compare_gb_s": rate, "exit": code}
        print(
            f"{kind}: {step:.3f} s/step ({step / base:.3f}x), trace {size / 1e6:.2f} MB, "
            f"compare {seconds:.2f} s ({rate:.2f} GB/s), peak {rss:.0f} MiB, exit {code}",
            flush=True,
        )
    if "whole" in result:
        result["sampled_over_whole_bytes"] = result["sampled"]["bytes"] / result["whole"]["bytes"]
        print(f"sampled/whole size: {result['sampled_over_whole_bytes']:.5f}")
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
