"""Side-by-side timings: ddp-verify against the PyTorch reference scripts, on this machine.

  bench/compare.sh [--runs N] [--json PATH]

For each linear configuration it times the two reference scripts the way a user runs them
(fixtures/linear_reference.py in one process, then under torchrun with gloo; their times
added) and `ddp-verify` end to end, N times each, and prints min and median with the ratio
reference / ours. Then `ddp-verify explore` throughput. Then tiny-lm at its default size against
the three scripts that make its goldens (fixtures/lm_reference.py). Then the ResNet golden cases:
ddp-verify end to end against the pure compute of its two runs (examples/pure_compute.rs:
forward, backward and step of every step, timed alone in one process), and resnet18's peak
memory (RSS of all processes) as the number of steps doubles. Results also go to JSON.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv/bin/python")
TORCHRUN = os.path.join(ROOT, ".venv/bin/torchrun")
TOOL = os.path.join(ROOT, "target/debug/ddp-verify")
PURE = os.path.join(ROOT, "target/debug/examples/pure_compute")
RESNET_CASES = ["resnet-tiny-k4-w2-shuffle", "resnet18-w2"]
# The same resnet18 case over more steps: what the per-step cost is once start-up is paid.
LONGER = ("resnet18-w2, 12 steps (no target)", "resnet18-w2", {"data_size": 64, "max_steps": 12})
# resnet18 steps for the memory rows (data for 16 steps; --max-steps picks 3, 6 or 12).
MEMORY = "--model resnet18 --data-size 64 --batch-size 4 --acc-steps 2 --gpus 2 --epochs 2"

CONFIGS = {
    "article (N=8 D=8 B=4 K=2 W=2, 2 epochs)": "--data-size 8 --batch-size 4 --acc-steps 2 --gpus 2 --epochs 2",
    "large (N=4096 D=512 B=32 K=8 W=4, 3 epochs, shuffle)":
        "--data-size 4096 --features 512 --batch-size 32 --acc-steps 8 --gpus 4 --epochs 3 --shuffle",
}


# tiny-lm at its default size: ddp-verify's three runs against the three reference scripts
# that make its goldens (fixtures/lm_reference.py: accumulation, torchrun ddp, big batch).
TINY_LM = "--data-size 8 --batch-size 4 --acc-steps 2 --gpus 2 --epochs 2"

RETRIES = []


def timed(cmd, env=None, retry=False):
    """Seconds and output of one run. A reference run may be retried once: torchrun with
    gloo on oversubscribed cores aborted a rank once in our measurements (not reproducible)."""
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.perf_counter() - start
    if out.returncode != 0 and retry:
        RETRIES.append(" ".join(cmd[:3]))
        return timed(cmd, env)
    if out.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}")
    return took, out.stdout


def reference(flags, tmp):
    gpus = re.search(r"--gpus (\d+)", flags).group(1)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    a, _ = timed([PY, "fixtures/linear_reference.py", "accumulation", "--out", tmp, *flags.split()], env, retry=True)
    d, _ = timed([TORCHRUN, "--standalone", f"--nproc_per_node={gpus}", "fixtures/linear_reference.py", "ddp",
                  "--out", tmp, *flags.split()], env, retry=True)
    return a + d


def lm_reference(flags, tmp):
    """The three tiny-lm reference runs, in lockstep as ddp-verify runs them: times added."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    script, args = "fixtures/lm_reference.py", ["--out", tmp, *flags.split(), "--lockstep"]
    a, _ = timed([PY, script, "accumulation", *args], env, retry=True)
    d, _ = timed([TORCHRUN, "--standalone", "--nproc_per_node=2", script, "ddp", *args], env, retry=True)
    b, _ = timed([PY, script, "big-batch", *args], env, retry=True)
    return a + d + b


def tiny_lm_rows(runs):
    """tiny-lm: the reference scripts against ddp-verify, and ddp-verify's peak memory."""
    with tempfile.TemporaryDirectory() as tmp:
        ref = summary([lm_reference(TINY_LM, tmp) for _ in range(runs)])
    ours = summary([timed([TOOL, "--model", "tiny-lm", *TINY_LM.split()])[0] for _ in range(runs)])
    ratio = ref["median"] / ours["median"]
    rss = max(peak_rss_mib(f"--model tiny-lm {TINY_LM}") for _ in range(runs))
    name = "tiny-lm (N=8 B=4 K=2 W=2, 2 epochs, + big batch)"
    print(f"{name:<58} {ref['min']:>7.2f} / {ref['median']:<7.2f} {ours['min']:>7.2f} / {ours['median']:<7.2f} "
          f"{ratio:>7.1f}x  ddp-verify <= 5 s: {'met' if ours['median'] <= 5 else 'NOT met'}")
    print(f"{'tiny-lm peak RSS, all processes (MiB)':<58} {'':>17} {rss:>17}")
    return {"flags": TINY_LM, "reference_s": ref, "ddp_verify_s": ours, "speedup": ratio, "peak_rss_mib": rss}


def golden_train(case):
    with open(os.path.join(ROOT, "golden", case, "config.json")) as f:
        return json.load(f)["train"]


def flags_of(train):
    flags = []
    for k, v in train.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            flags.append(flag)
        elif v is False:
            flags += ["--free-running"] if k == "lockstep" else []
        else:
            flags += [flag, str(v)]
    return flags


def pure_compute(train):
    _, out = timed([PURE, json.dumps(train)])
    return json.loads(out)["total_s"]


def peak_rss_mib(flags):
    _, out = timed(["bench/peak_rss.sh", TOOL, *flags.split()])
    return int(out.strip().splitlines()[-1])


def summary(xs):
    return {"min": min(xs), "median": statistics.median(xs), "runs": xs}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=os.path.join(ROOT, "target/bench/compare.json"))
    p.add_argument("--only", choices=["tiny-lm"], help="time only these rows")
    a = p.parse_args()
    if a.only == "tiny-lm":
        print(f"{'configuration':<58} {'PyTorch scripts':>17} {'ddp-verify':>17} {'speedup':>8}  target")
        json.dump({"tiny_lm": tiny_lm_rows(a.runs)}, sys.stdout, indent=2)
        print()
        return
    rows, results = [], {"machine": f"{os.cpu_count()} cores", "configs": {}, "explore": None}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in CONFIGS.items():
            ref = summary([reference(flags, tmp) for _ in range(a.runs)])
            ours = summary([timed([TOOL, *flags.split()])[0] for _ in range(a.runs)])
            ratio = ref["median"] / ours["median"]
            results["configs"][name] = {"flags": flags, "reference_s": ref, "ddp_verify_s": ours, "speedup": ratio}
            rows.append((name, ref, ours, ratio))
    _, text = timed([TOOL, "explore", "--model", "linear", "--cases", "500", "--max-gpus", "4", "--seed", "1"])
    per_min = float(re.search(r"\(([\d.]+) per minute", text).group(1))
    results["explore"] = {"cases": 500, "max_gpus": 4, "configs_per_minute": per_min}

    print(f"{'configuration':<58} {'PyTorch scripts':>17} {'ddp-verify':>17} {'speedup':>8}  target")
    print(f"{'':<58} {'min / median s':>17} {'min / median s':>17}")
    for i, (name, ref, ours, ratio) in enumerate(rows):
        target = ">= 10x: " + ("met" if ratio >= 10 else "NOT met") if i == 0 else "(none)"
        print(f"{name:<58} {ref['min']:>7.2f} / {ref['median']:<7.2f} {ours['min']:>7.2f} / {ours['median']:<7.2f} "
              f"{ratio:>7.1f}x  {target}")
    print(f"{'explore, linear, up to 4 ranks (configs per minute)':<58} {'':>17} {per_min:>17.0f} {'':>8}  "
          f">= 1000: {'met' if per_min >= 1000 else 'NOT met'}")
    results["tiny_lm"] = tiny_lm_rows(a.runs)
    resnet = {}
    print(f"\n{'ResNet golden case':<58} {'pure compute':>17} {'ddp-verify':>17} {'overhead':>8}  target")
    print(f"{'':<58} {'min / median s':>17} {'min / median s':>17}")
    for name, case, extra in [(c, c, {}) for c in RESNET_CASES] + [LONGER]:
        train = {**golden_train(case), **extra}
        # Interleaved, so a change in the machine's load falls on both sides alike.
        pairs = [(pure_compute(train), timed([TOOL, *flags_of(train)])[0]) for _ in range(a.runs)]
        pure, ours = summary([p for p, _ in pairs]), summary([o for _, o in pairs])
        ratio = ours["median"] / pure["median"]
        resnet[name] = {"train": train, "pure_compute_s": pure, "ddp_verify_s": ours, "overhead": ratio}
        target = f"<= 1.2x: {'met' if ratio <= 1.2 else 'NOT met'}" if not extra else "(none)"
        print(f"{name:<58} {pure['min']:>7.2f} / {pure['median']:<7.2f} {ours['min']:>7.2f} / {ours['median']:<7.2f} "
              f"{ratio:>7.2f}x  {target}")
    mem = {m: max(peak_rss_mib(f"{MEMORY} --max-steps {m}") for _ in range(a.runs)) for m in (3, 6, 12)}
    growth = {f"{m}->{2 * m}": mem[2 * m] / mem[m] for m in (3, 6)}
    resnet["memory"] = {"flags": MEMORY, "peak_rss_mib": mem, "growth": growth}
    for m in (3, 6):
        g = mem[2 * m] / mem[m]
        label = f"resnet18 peak RSS, all processes, {m} -> {2 * m} steps (MiB)"
        print(f"{label:<58} {mem[m]:>17} {mem[2 * m]:>17} {g:>7.2f}x  <= 1.1x: {'met' if g <= 1.1 else 'NOT met'}")
    results["resnet"] = resnet
    if RETRIES:
        print(f"note: {len(RETRIES)} reference run(s) failed once and were retried: {RETRIES}")
    results["reference_retries"] = RETRIES
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nJSON: {a.json}")


if __name__ == "__main__":
    main()
