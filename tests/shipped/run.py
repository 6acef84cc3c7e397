"""Runs the shipped-bug corpus (tests/shipped/cases.toml) through ddp-verify: every case's buggy
and fixed versions, each with the Python of its environment (scripts/setup-shipped.sh), K=4
and W=2 unless the case says otherwise. Each run's DDP leg (torchrun over W, as a user
launches it) is then judged alone by `ddp-verify watch --trace` (its stages' contracts, no
reference run): the run `watch -- COMMAND` would have made, recorded once for both checks.
Prints one row per run (case, version, the two exit codes and what they want, the report's
diagnosis.reason, seconds) and exits 1 unless every buggy version exits 1 (not equivalent) and
every fixed version 0 (equivalent), under both checks; a case whose `watch` field says why no
contract of one run can see its bug wants exit 0 from `watch` on both versions. A run whose
leg failed (exit 3: torchrun's rendezvous on a loaded machine) is run once more, as
tests/it/user_loops.rs does.

  scripts/shipped.sh [CASE...]    DDP_VERIFY=BIN (default target/debug/ddp-verify)
                                  SHIPPED_KEEP=DIR keeps each run's reports (CASE.SIDE.json,
                                  CASE.SIDE.watch.json), log and traces (CASE.SIDE/) there
                                  SHIPPED_RECORDER=DIR: the recorder (a python/ folder) put
                                  first on PYTHONPATH (default: this checkout's python/)
                                  SHIPPED_SKIP_TORCH_ENVS=1 leaves out the cases that need a
                                  torch environment of their own (tests/shipped/manifest.py)
                                  SHIPPED_DETAIL=1 prints each diagnosis.detail too
                                  DDP_VERIFY_KEEP_TRACES=DIR keeps each run's traces in
                                  DIR/shipped.CASE.SIDE (bench/causes.py)
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


def expected_watch(case, side):
    """A bug no contract of one run can see (`watch` in cases.toml) leaves both versions held."""
    return 0 if case.get("watch") else EXPECTED[side]


def diagnosis_of(report, key=None):
    """The report's diagnosis (under `fault` in watch's; the big batch's where DDP and
    accumulation agree and it parts), or None where it has no report."""
    try:
        with open(report) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    if key:
        return (got.get(key) or {}).get("diagnosis") or {}
    return got.get("diagnosis") or (got.get("big_batch") or {}).get("diagnosis") or {}


def run_one(binary, case, side, keep):
    """The two-run check of one version, then `watch --trace` on its DDP leg's trace: the exit
    codes, the two-run's and watch's diagnoses (reason, detail), and the seconds both took."""
    version = case[side]
    py = version["python"]
    tag = f"{case['name']}.{side}"
    report, watched = os.path.join(keep, tag + ".json"), os.path.join(keep, tag + ".watch.json")
    log = os.path.join(keep, tag + ".log")
    flags = shlex.split(case.get("ddp_verify", "--acc-steps 4 --gpus 2"))
    if not any(f.startswith("--timeout") for f in flags):
        flags += ["--timeout", "300"]  # a hung leg stops the run (exit 3), not CI
    # DDP_VERIFY_KEEP_TRACES=DIR keeps each run's traces (bench/causes.py judges them again).
    kept = os.environ.get("DDP_VERIFY_KEEP_TRACES")
    traces = os.path.join(os.path.abspath(kept), "shipped." + tag) if kept else os.path.join(keep, tag)
    argv = [binary, *flags, "--report", "json", "--report-file", report, "--force", "--save-trace", traces,
            "--", py, case["script"], *shlex.split(case.get("args", ""))]
    env = dict(os.environ)
    # The recorder: this checkout's (a torch environment, shared by clones, has none of its own).
    recorder = os.path.abspath(os.environ.get("SHIPPED_RECORDER") or os.path.join(ROOT, "python"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (recorder, env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    if not os.path.exists(py):
        return (127, 127), ("(no environment: scripts/setup-shipped.sh)", ""), ("", ""), 0.0
    for attempt in (1, 2):
        for old in (report, watched):
            if os.path.exists(old):
                os.remove(old)
        with open(log, "w") as out:
            rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        if rc != 3 or attempt == 2:
            break
        with open(log) as f:
            if "recording stopped" in f.read():  # the recorder's own failure: it would again
                break
        print(f"  {tag}: a leg failed (exit 3), running again", flush=True)
    watch = [binary, "watch", "--trace", os.path.join(traces, "ddp.safetensors"), "--report", "json",
             "--report-file", watched, "--force"]
    with open(log, "a") as out:
        watch_rc = subprocess.call(watch, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    seconds = time.monotonic() - t0
    causes = []
    for path, key in ((report, None), (watched, "fault")):
        d = diagnosis_of(path, key)
        if d is None:
            with open(log) as f:
                tail = [line.strip() for line in f if line.strip()]
            causes.append(("(no report)", tail[-1] if tail else ""))
        else:
            causes.append((d.get("reason", "none"), d.get("detail", "")))
    return (rc, watch_rc), causes[0], causes[1], seconds


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
    print(f"{'case':<{width}}  {'version':<{vwidth}} {'exit':>4} {'want':>4} {'watch':>5} {'want':>4}  "
          f"{'seconds':>7}  reason (two runs; watch)", flush=True)
    failed, start = [], time.monotonic()
    for case in cases:
        for side in ("buggy", "fixed"):
            (rc, watch_rc), (reason, detail), (watch_reason, watch_detail), seconds = run_one(binary, case, side, keep)
            want, watch_want = EXPECTED[side], expected_watch(case, side)
            marks = []
            if rc != want:
                marks.append(f"want exit {want}")
            if watch_rc != watch_want:
                marks.append(f"want watch's exit {watch_want}")
            if marks:
                failed.append(f"{case['name']} {side}")
            mark = "  <-- " + ", ".join(marks) if marks else ""
            print(f"{case['name']:<{width}}  {label[case['name'], side]:<{vwidth}} {rc:>4} {want:>4} {watch_rc:>5} "
                  f"{watch_want:>4}  {seconds:>7.1f}  {reason}; {watch_reason}{mark}", flush=True)
            if detail_too:
                for said in (detail, watch_detail):
                    if said:
                        print(f"{'':<{width}}    {said}", flush=True)
    total = time.monotonic() - start
    print(f"shipped: {len(cases)} cases, {2 * len(cases) - len(failed)} of {2 * len(cases)} runs as expected "
          f"under both checks, {total:.0f} s; reports, logs and traces in {keep}")
    if failed:
        print("shipped: not as expected: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
