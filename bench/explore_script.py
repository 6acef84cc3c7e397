"""explore -- COMMAND's own cost: what a case costs beyond running its legs. Issue 46's
target: under 0.5 s per case.

  .venv/bin/python bench/explore_script.py [--cases N] [--seed S] [--ddp-verify PATH]

Explores examples/uneven/train.py dealt right (`--deal accumulation`: every case equivalent,
so every draw runs and none is shrunk), then runs each drawn configuration again by itself,
as `ddp-verify --acc-steps K --gpus W --batch-size B -- COMMAND` (what a user would run to
check those configurations by hand). Two measures:
- explore's own accounting: its wall time less its cases' runs (the legs and their judging),
  per case (`own_seconds`);
- the ratio of explore's wall time to the direct runs' summed wall time, and their
  difference per case (which also counts each direct run's own start and report).
The last line is JSON with every number.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, ".venv", "bin", "python")
SCRIPT = os.path.join(ROOT, "examples", "uneven", "train.py")
ARGS = ["--samples", "{data_size}", "--batch", "{batch}", "--grad-accum", "{local_acc_steps}", "--deal", "accumulation"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=5)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--max-gpus", type=int, default=2)
    p.add_argument("--ddp-verify", default=os.path.join(ROOT, "target", "release", "ddp-verify"))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-explore-")
    cmd = [PY, SCRIPT, *ARGS]
    t0 = time.perf_counter()
    out = subprocess.run(
        [a.ddp_verify, "explore", "--json", "--cases", str(a.cases), "--seed", str(a.seed), "--max-gpus",
         str(a.max_gpus), "--regressions", os.path.join(tmp, "r.txt"), "--", *cmd],
        capture_output=True, text=True,
    )
    explore_wall = time.perf_counter() - t0
    if out.returncode != 0:
        print(out.stdout, out.stderr, file=sys.stderr)
        return 1
    found = json.loads(out.stdout)
    direct = []
    for case in found["cases"]:
        d = case["draw"]
        fills = {"data_size": str(d["data_size"])}
        argv = [a.ddp_verify, "--acc-steps", str(d["acc_steps"]), "--gpus", str(d["gpus"]), "--batch-size",
                str(d["batch"]), "--"] + [x.replace("{data_size}", fills["data_size"]) for x in cmd]
        t = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True)
        direct.append(time.perf_counter() - t)
        if r.returncode != 0:
            print(r.stdout, r.stderr, file=sys.stderr)
            return 1
    n = len(found["cases"])
    own = found["own_seconds"] / n
    diff = (explore_wall - sum(direct)) / n
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    print(f"explore: {n} cases in {explore_wall:.1f} s; its own time {own:.3f} s per case (target < 0.5 s)")
    print(f"the same configurations run one by one: {sum(direct):.1f} s; explore/direct "
          f"{explore_wall / sum(direct):.3f}, {diff:+.3f} s per case")
    print(json.dumps({"cases": n, "explore_wall": explore_wall, "own_per_case": own, "direct": direct,
                      "ratio": explore_wall / sum(direct), "diff_per_case": diff}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
