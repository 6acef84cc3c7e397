"""Causes, old build against new: every kept case's traces judged again by two ddp-verify
binaries (`compare`, as `-- COMMAND` judges its legs), and each difference in verdict, reason,
stage, owner, known fix, cause text or caution printed side by side.

Keep the cases' traces first (each test's or corpus case's legs, recorded once):

    DDP_VERIFY_KEEP_TRACES=/tmp/kept cargo test --test integration -- user_loops:: sharded:: deepspeed::
    DDP_VERIFY_KEEP_TRACES=/tmp/kept scripts/shipped.sh

then judge them with the build before a change and the build after:

    bench/causes.py OLD/ddp-verify target/debug/ddp-verify /tmp/kept [--detail] [--json OUT]

A case is a folder holding accumulation.safetensors and ddp.safetensors (and
big-batch.safetensors where the script ran one). Exit 0 whatever differs: a row is a place to
look, and the caller says whether it is better. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

FILES = ("accumulation.safetensors", "ddp.safetensors")
BIG = "big-batch.safetensors"


def cases(roots):
    """Every folder under `roots` that holds both legs' traces, sorted by name."""
    found = []
    for root in roots:
        for d, _, files in os.walk(root):
            if all(f in files for f in FILES):
                found.append(d)
    return sorted(found)


def judged(binary, case):
    """What one binary's `compare` makes of a case's traces: its exit code and JSON report."""
    with tempfile.TemporaryDirectory() as t:
        report = os.path.join(t, "r.json")
        argv = [binary, "compare", *(os.path.join(case, f) for f in FILES)]
        if os.path.exists(os.path.join(case, BIG)):
            argv += ["--big-batch", os.path.join(case, BIG)]
        argv += ["--report", "json", "--report-file", report]
        run = subprocess.run(argv, capture_output=True, text=True)
        try:
            with open(report) as f:
                return run.returncode, json.load(f)
        except (OSError, ValueError):
            return run.returncode, {"error": (run.stderr.strip().splitlines() or ["(nothing)"])[-1]}


def said(code, r):
    """The fields a change of causes may move, flat."""
    d = r.get("diagnosis") or {}
    big = (r.get("big_batch") or {}).get("diagnosis") or {}
    caution = r.get("caution") or {}
    owner = d.get("owner") or {}
    fix = d.get("known_fix") or {}
    return {
        "exit": code,
        "verdict": r.get("verdict", r.get("error")),
        "reason": d.get("reason"),
        "stage": d.get("stage"),
        "owner": " ".join(str(owner.get(k)) for k in ("name", "version", "api") if owner.get(k)) or owner.get("kind"),
        "known_fix": fix.get("tracker"),
        "detail": d.get("detail"),
        "big_reason": big.get("reason"),
        "big_stage": big.get("stage"),
        "big_detail": big.get("detail"),
        "caution": caution.get("reason"),
        "caution_detail": caution.get("detail"),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("roots", nargs="+")
    p.add_argument("--detail", action="store_true", help="print the cause texts of rows that differ")
    p.add_argument("--json", help="write every case's old and new fields here")
    a = p.parse_args()
    rows, changed = [], 0
    for case in cases(a.roots):
        old, new = said(*judged(a.old, case)), said(*judged(a.new, case))
        rows.append({"case": case, "old": old, "new": new})
        moved = [k for k in old if old[k] != new[k]]
        name = os.path.relpath(case, a.roots[0]) if len(a.roots) == 1 else case
        if not moved:
            print(f"same     {name}: exit {new['exit']} {new['reason'] or new['caution'] or '-'} "
                  f"({new['stage'] or '-'}, {new['owner'] or '-'})")
            continue
        changed += 1
        print(f"CHANGED  {name}: {', '.join(moved)}")
        for k in moved:
            if k.endswith("detail") and not a.detail:
                continue
            print(f"    {k}:\n      old {old[k]}\n      new {new[k]}")
    print(f"{len(rows)} cases, {changed} changed")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
