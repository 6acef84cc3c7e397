"""Runs the shipped-bug corpus (tests/shipped/cases.toml) through ddp-verify: every case's buggy
and fixed versions, each with the Python of its environment (scripts/setup-shipped.sh), K=4
and W=2 unless the case says otherwise. Prints one row per run (case, version, exit code,
the report's diagnosis.reason, seconds) and exits 1 unless every buggy version exits 1 (not
equivalent) and every fixed version 0 (equivalent). A run whose leg failed (exit 3: torchrun's
rendezvous on a loaded machine) is run once more, as tests/it/user_loops.rs does.

  scripts/shipped.sh [CASE...]    DDP_VERIFY=BIN (default target/debug/ddp-verify)
                                  SHIPPED_KEEP=DIR keeps each run's report and log there
                                  SHIPPED_RECORDER=DIR: the recorder (a python/ folder) put
                                  first on PYTHONPATH (default: this checkout's python/)
                                  SHIPPED_SKIP_TORCH_ENVS=1 leaves out the cases that need a
                                  torch environment of their own (tests/shipped/manifest.py)
                                  SHIPPED_DETAIL=1 prints each diagnosis.detail too
                                  DDP_VERIFY_KEEP_TRACES=DIR keeps each run's traces in
                                  DIR/shipped.CASE.SIDE (bench/causes.py)
                                  SHIPPED_WATCH=1 runs each case's DDP command once under
                                  `ddp-verify watch` (one run judged by its stages'
                                  contracts); a case whose `watch` field says why no
                                  contract can see its bug wants exit 0 from both versions
Standard library only (Python 3.11+).
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import manifest  # noqa: E402

EXPECTED = {"buggy": 1, "fixed": 0}
WATCH = os.environ.get("SHIPPED_WATCH") == "1"


def expected(case, side):
    """A bug no contract of one run can see (`watch` in cases.toml) leaves both versions held."""
    return 0 if WATCH and case.get("watch") else EXPECTED[side]


def ddp_command(case, py):
    """The case's DDP leg as ddp-verify -- COMMAND would launch it: torchrun over W, the
    placeholders filled as that leg fills them."""
    flags = shlex.split(case.get("ddp_verify", "--acc-steps 4 --gpus 2"))
    k, w = int(flags[flags.index("--acc-steps") + 1]), int(flags[flags.index("--gpus") + 1])
    fills = {"{acc_steps}": k, "{local_acc_steps}": k // w, "{gpus}": w, "{world}": w, "{leg}": "ddp"}
    args = case.get("args", "")
    for key, value in fills.items():
        args = args.replace(key, str(value))
    return [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(w), case["script"],
            *shlex.split(args)]


def run_one(binary, case, side, keep):
    version = case[side]
    py = version["python"]
    tag = f"{case['name']}.{side}"
    report = os.path.join(keep, tag + ".json")
    log = os.path.join(keep, tag + ".log")
    flags = shlex.split(case.get("ddp_verify", "--acc-steps 4 --gpus 2"))
    if not any(f.startswith("--timeout") for f in flags):
        flags += ["--timeout", "300"]  # a hung leg stops the run (exit 3), not CI
    # DDP_VERIFY_KEEP_TRACES=DIR keeps each run's traces (bench/causes.py judges them again).
    traces = os.environ.get("DDP_VERIFY_KEEP_TRACES")
    if traces:
        flags += ["--save-trace", os.path.join(os.path.abspath(traces), "shipped." + tag)]
    argv = [binary, *flags, "--report", "json", "--report-file", report, "--force",
            "--", py, case["script"], *shlex.split(case.get("args", ""))]
    if WATCH:
        argv = [binary, "watch", "--timeout", "300", "--report", "json", "--report-file", report, "--force",
                "--", *ddp_command(case, py)]
    env = dict(os.environ)
    # The recorder: this checkout's (a torch environment, shared by clones, has none of its own).
    recorder = os.path.abspath(os.environ.get("SHIPPED_RECORDER") or os.path.join(ROOT, "python"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (recorder, env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    if not os.path.exists(py):
        return 127, "(no environment: scripts/setup-shipped.sh)", "", 0.0
    for attempt in (1, 2):
        if os.path.exists(report):
            os.remove(report)
        with open(log, "w") as out:
            rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        if rc != 3 or attempt == 2:
            break
        with open(log) as f:
            if "recording stopped" in f.read():  # the recorder's own failure: it would again
                break
        print(f"  {tag}: a leg failed (exit 3), running again", flush=True)
    seconds = time.monotonic() - t0
    try:
        with open(report) as f:
            got = json.load(f)
        diagnosis = (got.get("fault") or {}).get("diagnosis") or {} if WATCH else got.get("diagnosis") or {}
        reason, detail = diagnosis.get("reason", "none"), diagnosis.get("detail", "")
    except (OSError, ValueError):
        with open(log) as f:
            tail = [line.strip() for line in f if line.strip()]
        reason, detail = "(no report)", tail[-1] if tail else ""
    return rc, reason, detail, seconds


def main():
    names = sys.argv[1:]
    binary = os.path.abspath(os.environ.get("DDP_VERIFY", os.path.join(ROOT, "target/debug/ddp-verify")))
    if not os.access(binary, os.X_OK):
        sys.exit(f"shipped: no ddp-verify binary at {binary} (DDP_VERIFY=BIN)")
    cases = json.loads(subprocess.check_output([sys.executable, os.path.join(HERE, "manifest.py"), "cases", *names]))
    if not cases:
        print("shipped: no case to run")
        return
    keep = os.environ.get("SHIPPED_KEEP") or tempfile.mkdtemp(prefix="ddp-verify-shipped-")
    os.makedirs(keep, exist_ok=True)
    detail_too = os.environ.get("SHIPPED_DETAIL") == "1"
    width = max(len(c["name"]) for c in cases)
    label = {(c["name"], side): side + " " + (" ".join(c[side].get("pins", [])) or c[side]["env"])
             for c in cases for side in ("buggy", "fixed")}
    vwidth = max(len(v) for v in label.values())
    print(f"{'case':<{width}}  {'version':<{vwidth}} {'exit':>4} {'want':>4}  {'seconds':>7}  reason", flush=True)
    failed, start = [], time.monotonic()
    for case in cases:
        for side in ("buggy", "fixed"):
            rc, reason, detail, seconds = run_one(binary, case, side, keep)
            want = expected(case, side)
            ok = rc == want
            if not ok:
                failed.append(f"{case['name']} {side}")
            mark = "" if ok else "  <-- want exit %d" % want
            print(f"{case['name']:<{width}}  {label[case['name'], side]:<{vwidth}} {rc:>4} {want:>4}  "
                  f"{seconds:>7.1f}  {reason}{mark}", flush=True)
            if detail_too and detail:
                print(f"{'':<{width}}    {detail}", flush=True)
    total = time.monotonic() - start
    print(f"shipped: {len(cases)} cases, {2 * len(cases) - len(failed)} of {2 * len(cases)} runs as expected, "
          f"{total:.0f} s; reports and logs in {keep}")
    if failed:
        print("shipped: not as expected: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
