"""Subtle real bugs against their honest twins: `ddp-verify --acc-steps 4 --gpus 2 -- python
examples/subtle/train.py --grad-accum {local_acc_steps} ...` on every bug of the example and on
its twin (`--bug none`, the same other flags), under AdamW and RMSprop at lr 1e-3, and under
AdamW at a fine-tuning rate (2e-5) for a few; each case's exit code, diagnosis and caution.

  .venv/bin/python bench/subtle.py --binary target/debug/ddp-verify --out /tmp/subtle [--only BUG,...]

A bug passed (exit 0) or an honest twin flagged (exit 1) is marked `!!`. Prints a table and
writes DIR/subtle.json (every case, with its reports under DIR/<case>.json). Standard library
only; the recorder must be importable by the venv's Python (PYTHONPATH=python), as
`ddp-verify -- python` needs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
SCRIPT = os.path.join(ROOT, "examples", "subtle", "train.py")

# Each bug with the flags its honest twin shares (the setting it is a mistake in).
BUGS = {
    "wd-local-batch": "--scale-wd-to 16",
    "rank-no-wd": "",
    "group1-warmup-per-micro": "--head-warmup 8",
    "unfreeze-after-ddp": "--freeze-until 1",
    "uncertainty-outside-ddp": "--loss-weights learned",
    "ema-per-micro": "--ema 0.9",
    "clip-per-rank-manual-allreduce": "--sync manual --clip 0.05",
    "wd-per-micro": "--wd-by-hand",
    "per-rank-normaliser": "--normaliser step",
}
# (optimizer, lr, the bugs run there)
SETTINGS = [
    ("adamw", "1e-3", list(BUGS)),
    ("rmsprop", "1e-3", list(BUGS)),
    ("adamw", "2e-5", ["wd-local-batch", "rank-no-wd", "ema-per-micro", "wd-per-micro", "per-rank-normaliser"]),
]


def cases(only):
    """(name, bug, optimizer, lr, script flags): each bug, then its twin where not run yet."""
    out, seen = [], set()
    for optimizer, lr, bugs in SETTINGS:
        for bug in bugs:
            if only and bug not in only:
                continue
            for b in (bug, "none"):
                flags = f"--optimizer {optimizer} --lr {lr} {BUGS[bug]} --bug {b}".split()
                key = " ".join(flags)
                if key in seen:
                    continue
                seen.add(key)
                twin = "" if b != "none" else f" ({bug}'s twin)" if BUGS[bug] else ""
                name = f"{b}{twin} {optimizer} {lr}"
                out.append((name, b, bug, optimizer, lr, flags))
    return out


def run(binary, flags, report):
    argv = [binary, "--acc-steps", "4", "--gpus", "2", "--report", "json", "--report-file", report, "--", PYTHON, SCRIPT]
    argv += ["--grad-accum", "{local_acc_steps}", *flags]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for attempt in range(2):
        if os.path.exists(report):
            os.remove(report)
        t = time.time()
        p = subprocess.run(argv, capture_output=True, text=True, env=env)
        if p.returncode != 3 or attempt:
            break
        print(f"  a leg failed once, running again: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    try:
        with open(report) as f:
            r = json.load(f)
    except (OSError, ValueError):
        r = {"error": (p.stderr.strip().splitlines() or ["(nothing)"])[-1]}
    return p.returncode, r, time.time() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True, help="the ddp-verify to judge with")
    ap.add_argument("--out", required=True, help="folder for subtle.json and each case's report")
    ap.add_argument("--only", default="", help="comma-separated bugs (with their twins)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = {b for b in args.only.split(",") if b}
    rows = []
    header = f"{'case':<58} {'exit':>4}  {'reason':<28} caution / detail"
    print(header)
    print("-" * len(header))
    for name, bug, of, optimizer, lr, flags in cases(only):
        slug = "".join(c if c.isalnum() or c in "-." else "_" for c in name)
        report = os.path.join(args.out, f"{slug}.json")
        code, r, secs = run(args.binary, flags, report)
        d = r.get("diagnosis") or {}
        caution = r.get("caution") or {}
        detail = (d.get("detail") or "").strip().splitlines()
        row = {
            "case": name,
            "bug": bug,
            "twin_of": of if bug == "none" else None,
            "optimizer": optimizer,
            "lr": lr,
            "flags": " ".join(flags),
            "exit": code,
            "reason": d.get("reason"),
            "detail": detail[0] if detail else None,
            "caution": caution.get("reason"),
            "verdict": r.get("verdict"),
            "error": r.get("error"),
            "seconds": round(secs, 1),
        }
        wrong = (bug == "none" and code != 0) or (bug != "none" and (code != 1 or d.get("reason") == "chaos"))
        row["wrong"] = wrong
        rows.append(row)
        said = caution.get("reason") or row["detail"] or row["error"] or ""
        mark = "!!" if wrong else "  "
        print(f"{mark}{name:<56} {code!s:>4}  {str(d.get('reason') or '-'):<28} {said[:90]}", flush=True)
    with open(os.path.join(args.out, "subtle.json"), "w") as f:
        json.dump({"binary": args.binary, "cases": rows}, f, indent=1)
    bugs = [r for r in rows if r["bug"] != "none"]
    twins = [r for r in rows if r["bug"] == "none"]
    print(
        f"\nbugs caught (exit 1, not chaos): {sum(not r['wrong'] for r in bugs)}/{len(bugs)}; "
        f"honest twins EQUIVALENT: {sum(not r['wrong'] for r in twins)}/{len(twins)}"
    )


if __name__ == "__main__":
    main()
