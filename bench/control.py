"""What the control run costs (`judge::control`): it runs only where a user's runs part after
step 0 with no recorded fact apart, and then costs one more accumulation leg.

  .venv/bin/python bench/control.py [--binary target/debug/ddp-verify] [--repeat 2] [OUT_DIR]

Cases (examples/, `--acc-steps 4 --gpus 2` unless said): nanoGPT under AdamW (equivalent: the
carried bound holds, no control), nanoGPT's sync-after-forward bug (a fact decides, no
control), nanoGPT under RMSprop (final weights under no carried bound part beyond the fixed
tolerance: a control runs), and FSDP2 at W=3 K=9 B=3 N=82 (later steps part: a control runs).
Per case: the legs' seconds as each leg's line reports them (median over --repeat), whether a
control ran, and its share of the wall time; the last line is JSON with every number.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, ".venv", "bin", "python")

CASES = [
    ("nanogpt adamw", "--acc-steps 4 --gpus 2", "nanogpt", "--grad-accum {acc_steps}"),
    ("nanogpt bug", "--acc-steps 4 --gpus 2", "nanogpt", "--grad-accum {acc_steps} --bug sync-after-forward"),
    ("nanogpt rmsprop", "--acc-steps 4 --gpus 2", "nanogpt", "--grad-accum {acc_steps} --optimizer rmsprop"),
    ("fsdp2 W=3 N=82", "--acc-steps 9 --gpus 3 --batch-size 3", "fsdp2", "--grad-accum {acc_steps} --samples 82 --batch {batch}"),
]
LEG = re.compile(r"the (\w[\w-]*) leg: \d+ optimizer steps in ([\d.]+) s")


def run(binary: str, flags: str, example: str, args: str, out: str) -> dict:
    cmd = [binary, *flags.split()]
    cmd += ["--force", "--save-trace", out, "--", PY, os.path.join(ROOT, "examples", example, "train.py"), *args.split()]
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    legs = {name: float(s) for name, s in LEG.findall(p.stderr)}
    return {"exit": p.returncode, "wall": wall, "legs": legs, "control": "control" in legs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "ddp-verify"))
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="bench-control-")
    rows = []
    for name, flags, example, args in CASES:
        runs = [run(a.binary, flags, example, args, os.path.join(out, re.sub(r"\W+", "_", name))) for _ in range(a.repeat)]
        wall = statistics.median(r["wall"] for r in runs)
        legs = {k: statistics.median(r["legs"].get(k, 0.0) for r in runs) for k in runs[0]["legs"]}
        control = legs.get("control", 0.0)
        row = {"case": name, "exit": runs[0]["exit"], "control": runs[0]["control"], "wall_s": wall, "legs_s": legs,
               "control_share": control / wall if wall else 0.0}
        rows.append(row)
        print(f"{name:<18} exit {row['exit']}  control {'yes' if row['control'] else 'no ':<3}  wall {wall:6.1f} s  "
              f"control {control:5.1f} s ({100 * row['control_share']:.0f}% of the wall time)", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
