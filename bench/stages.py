"""What the stage facts (docs/stages.md) cost per recorded step: this checkout's recorder
against an older one without them, on the nanoGPT example and on bench/fsdp2.py's FSDP2 case.

  .venv/bin/python bench/stages.py [--base REV | --base-python DIR] [--stages-python DIR] [--rounds N]
                                   [--cases nanogpt-1,nanogpt-ddp,fsdp2-tiny[,fsdp2-50m]]

The recorder without stage facts is `python/` at `--base` (default de1fcb4, the last commit
before them), unpacked from git into a temporary folder (or an older checkout's `python/`
given as `--base-python`); a process takes one recorder or the other by having its
`python/` first on PYTHONPATH (each run reports which `ddp_verify_trace` it imported, and the
benchmark stops if it is not the one meant). `--stages-python DIR` measures another copy of
the recorder with stage facts instead of this checkout's (a change tried in a scratch copy).

Cases, each run as a whole process the way a user runs it:
- nanogpt-1: examples/nanogpt/train.py unmodified, one process, `--grad-accum 4` (the
  accumulation leg), recorded with no edit as `ddp-verify -- python train.py` does (the
  recorder's `autoload/` first on PYTHONPATH and the DDP_VERIFY_* variables set);
- nanogpt-ddp: the same under `torchrun --nproc_per_node 2` (the DDP leg, K/W=2 per rank);
- fsdp2-tiny, fsdp2-50m: bench/fsdp2.py's rank script under torchrun (2 ranks, gloo, FSDP2
  over every block, K/W=2, AdamW), `record()` at its default sample ("auto": the 50.4M
  parameters sampled at 1024 positions, the tiny model whole; `--fsdp2-sample` to change).
  fsdp2-50m is not in the default cases: its steps take seconds each on a CPU (its gloo
  all-gathers of the weights), about 2 minutes a round.
Per case, three configurations: no recorder, the recorder without stage facts (base) and with
them (stages). A small runner around each script times rank 0's optimizer steps from one
step's end to the next (a global optimizer-step post hook: forwards, backwards, the step and
all the recorder's work in it; the first interval, which finds the model, is left out) in wall
time, in the training thread's CPU time (`cpu`: steadier on a loaded machine, but blind to
time spent waiting in collectives) and in the process's (`proc`: the recorder's writer thread
and gloo's too), and the run's median of each is its seconds per step. Each round runs the
three configurations back to back, in reverse order every other round, so that a drift in
the machine's speed falls on all of them; the ratios are taken within a round (stages / base:
what the 5% target is about; base / none: the recorder's own cost) and their median over
rounds is quoted, with min-max. Last line: JSON with every number. The defaults take about 6
minutes on a loaded 2-core machine; a busy one widens the min-max of the wall ratios most.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, ".venv", "bin", "python")
TORCHRUN = os.path.join(ROOT, ".venv", "bin", "torchrun")
NANOGPT = os.path.join(ROOT, "examples", "nanogpt", "train.py")
BASE = "de1fcb4"  # the last commit before the stage facts

# Runs a training script (argv[2:]) as its own __main__ and writes rank 0's step ends, and
# which recorder the process imported, to argv[1].
RUNNER = r'''
import json, os, runpy, sys, time
from torch.optim.optimizer import register_optimizer_step_post_hook

ends = []
# Wall time, the training thread's CPU time, the process's (the recorder's writer thread too).
register_optimizer_step_post_hook(
    lambda opt, args, kwargs: ends.append((time.perf_counter(), time.thread_time(), time.process_time()))
)
out, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
if os.environ.get("RANK", "0") == "0":
    mod = sys.modules.get("ddp_verify_trace")
    json.dump({"ends": ends, "recorder": getattr(mod, "__file__", None)}, open(out, "w"))
'''

CONFIGS = ["none", "base", "stages"]
CLOCKS = ["wall", "cpu", "proc"]


def has_stage_facts(python: str) -> bool:
    """Whether a recorder's `python/` records stage facts (`_stages/`; `_stages.py` before it)."""
    package = os.path.join(python, "ddp_verify_trace")
    return os.path.exists(os.path.join(package, "_stages")) or os.path.exists(os.path.join(package, "_stages.py"))


def unpack_base(rev: str, into: str) -> str:
    """`python/` at `rev`, unpacked under `into`; its path."""
    tar = subprocess.run(["git", "-C", ROOT, "archive", rev, "python"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(into, filter="data")
        else:
            t.extractall(into)
    return os.path.join(into, "python")


def command(case: str, args: argparse.Namespace, runner: str, out: str, trace: str | None, tmp: str) -> list[str]:
    world = args.world
    launch = [TORCHRUN, "--standalone", f"--nproc_per_node={world}"]
    if case.startswith("nanogpt"):
        script = [NANOGPT, "--grad-accum", "4", "--samples", str(args.nanogpt_samples)]
        return ([PY] if case == "nanogpt-1" else launch) + [runner, out] + script
    size = case.split("-", 1)[1]
    rank = os.path.join(tmp, "fsdp2_rank.py")
    if not os.path.exists(rank):
        sys.path.insert(0, HERE)
        from fsdp2 import RANK_SCRIPT  # bench/fsdp2.py's FSDP2 case, as it is

        with open(rank, "w") as f:
            f.write(RANK_SCRIPT)
    steps = args.fsdp2_steps if size == "tiny" else args.fsdp2_50m_steps
    # Its own timing file is not read (the runner's is), and goes to tmp.
    return launch + [runner, out, rank, size, str(steps), trace or "-", args.fsdp2_sample, os.path.join(tmp, "own.json")]


def run(case: str, config: str, args: argparse.Namespace, pythons: dict[str, str], tmp: str) -> dict[str, float]:
    """One whole run of `case` under `config`: its median seconds per step by each clock."""
    runner = os.path.join(tmp, "runner.py")
    out = os.path.join(tmp, "ends.json")
    trace_dir = os.path.join(tmp, "traces")
    shutil.rmtree(trace_dir, ignore_errors=True)
    os.makedirs(trace_dir)
    if os.path.exists(out):
        os.remove(out)
    python = pythons["stages" if config == "none" else config]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDP_VERIFY_")}
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([python] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    trace = None
    if config != "none":
        trace = os.path.join(trace_dir, "t.safetensors")
        if case.startswith("nanogpt"):
            # As `ddp-verify --acc-steps 4 --gpus W -- python train.py` starts each leg.
            ddp = case != "nanogpt-1"
            env["PYTHONPATH"] = os.pathsep.join([os.path.join(python, "ddp_verify_trace", "autoload"), env["PYTHONPATH"]])
            env.update({
                "DDP_VERIFY_TRACE": trace,
                "DDP_VERIFY_LEG": "ddp" if ddp else "accumulation",
                "DDP_VERIFY_ACC_STEPS": "4",
                "DDP_VERIFY_LOCAL_ACC_STEPS": str(4 // args.world if ddp else 4),
                "DDP_VERIFY_WORLD": str(args.world),
                "DDP_VERIFY_BATCH": "2",
            })  # fmt: skip
    cmd = command(case, args, runner, out, trace, tmp)
    p = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=args.timeout)
    if not os.path.exists(out):
        sys.exit(f"{case} {config}: no step times (exit {p.returncode}):\n{p.stderr[-3000:]}")
    got = json.load(open(out))
    imported = got["recorder"] or ""
    if not os.path.abspath(imported).startswith(os.path.abspath(python) + os.sep):
        sys.exit(f"{case} {config}: imported {imported}, not the recorder under {python}")
    if trace is not None and not os.path.exists(trace):
        sys.exit(f"{case} {config}: the recorder wrote no trace (exit {p.returncode}):\n{p.stderr[-3000:]}")
    ends = got["ends"]
    if len(ends) < 3:
        sys.exit(f"{case} {config}: fewer than 3 optimizer steps")
    out = {"steps": len(ends)}
    for i, clock in enumerate(CLOCKS):
        out[clock] = statistics.median([b[i] - a[i] for a, b in zip(ends, ends[1:])][1:])
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def print_table(results: dict, band: tuple[str, str]) -> None:
    """Per case and clock: each configuration's median seconds per step, and the ratios'
    median with the `band` keys around it (min-max, or the quartiles)."""
    lo, hi = band
    print()
    print(f"{'case':<12} {'clock':<5} {'no recorder':>13} {'base':>13} {'stages':>13}  {'base/none':>20}  {'stages/base':>20}  target")
    for case, row in results.items():
        for clock in CLOCKS:
            r = row[clock]
            ms = "".join(f" {r[c]['median'] * 1e3:>10.2f} ms" for c in CONFIGS)
            ratio = lambda k: f"{r[k]['median']:.3f} [{r[k][lo]:.3f}-{r[k][hi]:.3f}]"  # noqa: E731
            met = ("met" if r["stages/base"]["median"] <= 1.05 else "NOT met") if clock == "wall" else ""
            print(f"{case if clock == 'wall' else '':<12} {clock:<5}{ms}  {ratio('base/none'):>20}  {ratio('stages/base'):>20}  {met}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default=BASE, help="the commit whose python/ has no stage facts")
    p.add_argument("--base-python", default=None, help="an older checkout's python/ instead of --base")
    p.add_argument("--stages-python", default=os.path.join(ROOT, "python"), help="the python/ with stage facts (a change tried)")
    p.add_argument("--cases", default="nanogpt-1,nanogpt-ddp,fsdp2-tiny", help="of nanogpt-1, nanogpt-ddp, fsdp2-tiny, fsdp2-50m")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three configurations per case")
    p.add_argument("--rounds-50m", type=int, default=2, help="rounds for fsdp2-50m (about 2 minutes each)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--nanogpt-samples", type=int, default=512, help="512: 64 optimizer steps per run")
    p.add_argument("--fsdp2-steps", type=int, default=40)
    p.add_argument("--fsdp2-50m-steps", type=int, default=5)
    p.add_argument("--fsdp2-sample", default="auto", help="record()'s sample in the FSDP2 cases: auto, full or N")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    args = p.parse_args()
    cases = args.cases.split(",")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stages-bench-") as tmp:
        base = os.path.abspath(args.base_python) if args.base_python else unpack_base(args.base, os.path.join(tmp, "base"))
        if has_stage_facts(base):
            sys.exit(f"{base} has the stage facts (ddp_verify_trace/_stages/): give an older --base")
        pythons = {"base": base, "stages": os.path.abspath(args.stages_python)}
        with open(os.path.join(tmp, "runner.py"), "w") as f:
            f.write(RUNNER)
        print(f"stage facts' cost per recorded step: {pythons['stages']} against {args.base_python or args.base}")
        print("per run: rank 0's median seconds per optimizer step (wall; cpu: the training thread's CPU")
        print("time; proc: the process's); ratios within a round, median over rounds [min-max];")
        print("stages/base is the 5% target's")
        results = {}
        for case in cases:
            rounds = args.rounds_50m if case == "fsdp2-50m" else args.rounds
            per: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
            for r in range(rounds):
                for config in CONFIGS if r % 2 == 0 else CONFIGS[::-1]:
                    per[config].append(run(case, config, args, pythons, tmp))
                print(f"  {case} round {r + 1}/{rounds}: " + ", ".join(
                    f"{c} {per[c][-1]['wall'] * 1e3:.2f} ms" for c in CONFIGS), flush=True)  # fmt: skip
            row: dict[str, object] = {"rounds": rounds, "steps_per_run": per["none"][0]["steps"]}
            for clock in CLOCKS:
                row[clock] = {c: spread([x[clock] for x in per[c]]) for c in CONFIGS}
                row[clock]["stages/base"] = spread([s[clock] / b[clock] for s, b in zip(per["stages"], per["base"])])
                row[clock]["base/none"] = spread([b[clock] / n[clock] for b, n in zip(per["base"], per["none"])])
                row[clock]["stages/none"] = spread([s[clock] / n[clock] for s, n in zip(per["stages"], per["none"])])
            results[case] = row
        print_table(results, ("min", "max"))
        print(f"({time.perf_counter() - started:.0f} s)")
        print(json.dumps({"base": args.base_python or args.base, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
