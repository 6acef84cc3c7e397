"""The sweep of current releases: every path of bench/sweep/configs.toml at every point of its
grid, under the two-run check (`ddp-verify --acc-steps K --gpus W -- COMMAND`) and under `watch`
(its DDP leg's trace judged alone), over bench/sweep/requirements.txt's pins (.venv-sweep, made by
bench/sweep/setup.sh). Rewrites docs/sweep.md's table from the results, each row's triage read
from bench/sweep/triage.toml (a path's verdict that is not EQUIVALENT and has no triage there is
marked UNTRIAGED, and the command exits 1).

  bash bench/sweep/setup.sh && python3 bench/sweep/run.py [PATH...]   (about 40 minutes on 2 cores)
      DDP_VERIFY=BIN (default target/debug/ddp-verify); SWEEP_KEEP=DIR keeps reports and traces
      --table-only: rebuild docs/sweep.md from bench/sweep/results.json, running nothing
      --at=W,K,DTYPE: only that point of each path's grid

Not part of CI's run (tests/it/sweep.rs runs a few of its cheapest points). Standard library
only (Python 3.11+).
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results.json")
TABLE = os.path.join(ROOT, "docs", "sweep.md")
VERDICT = {0: "EQUIVALENT", 1: "NOT EQUIVALENT", 2: "bad input", 3: "a leg failed", 4: "no verdict"}


def points(cfg, names, at=None):
    """Every configuration: (path, W, K, dtype), in the file's order."""
    for path in cfg["path"]:
        if names and path["name"] not in names and path["library"] not in names:
            continue
        for dtype in ("float32", "bf16"):
            for w, k in cfg["grids"][path["grid"]]:
                if at is None or at == (w, k, dtype):
                    yield path, w, k, dtype


def diagnosis(report, key=None):
    try:
        with open(report) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    got = got.get(key) or {} if key else got
    d = got.get("diagnosis") or (got.get("big_batch") or {}).get("diagnosis") or {}
    owner = d.get("owner") or {}
    who = " ".join(x for x in (owner.get("name"), owner.get("version")) if x) or owner.get("kind", "")
    return {"stage": d.get("stage"), "reason": d.get("reason"), "owner": who, "detail": d.get("detail", "")}


def run_point(binary, python, path, w, k, dtype, keep):
    tag = f"{path['name']}.w{w}k{k}.{dtype}"
    report, watched, log = (os.path.join(keep, tag + ext) for ext in (".json", ".watch.json", ".log"))
    traces = os.path.join(keep, tag)
    command = path["command"].replace("{python}", python) + (" " + path["bf16"] if dtype == "bf16" else "")
    # Each point runs in a folder of its own, the repository's files named by absolute path:
    # what a leg creates in its working folder is moved aside under the traces, so a run
    # from the checkout would take files made there meanwhile (and the scripts' outputs).
    work = os.path.join(keep, tag + ".cwd")
    os.makedirs(work, exist_ok=True)
    words = [os.path.join(ROOT, x) if not x.startswith("-") and os.path.exists(os.path.join(ROOT, x)) else x
             for x in shlex.split(command)]
    argv = [binary, "--acc-steps", str(k), "--gpus", str(w), *shlex.split(path.get("flags", "")), "--timeout", "300",
            "--report", "json", "--report-file", report, "--force", "--save-trace", traces, "--", *words]
    t0 = time.monotonic()
    for attempt in (1, 2):  # torchrun's rendezvous on a loaded machine fails now and then (exit 3)
        with open(log, "w") as out:
            rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, cwd=work)
        if rc != 3:
            break
    watch_rc = None
    ddp_trace = os.path.join(traces, "ddp.safetensors")
    if os.path.exists(ddp_trace):
        with open(log, "a") as out:
            watch_rc = subprocess.call([binary, "watch", "--trace", ddp_trace, "--report", "json", "--report-file",
                                        watched, "--force"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    tail = ""
    if rc not in (0, 1):
        with open(log) as f:
            lines = [line.strip() for line in f if line.strip()]
        tail = lines[-1] if lines else ""
    return {"path": path["name"], "library": path["library"], "gpus": w, "acc_steps": k, "dtype": dtype,
            "command": command, "exit": rc, "watch_exit": watch_rc, "two_runs": diagnosis(report),
            "watch": diagnosis(watched, "fault"), "tail": tail, "seconds": round(time.monotonic() - t0, 1)}


def triage_of(row, triage):
    """The triage entry that covers a row: its path, and where given its dtype and check."""
    for t in triage:
        if t["path"] != row["path"] or t.get("dtype", row["dtype"]) != row["dtype"]:
            continue
        if "gpus" in t and t["gpus"] != row["gpus"]:
            continue
        return t
    return None


def cell(rc, d):
    if rc is None:
        return "no trace"
    text = VERDICT.get(rc, f"exit {rc}")
    if rc == 1 and d:
        text += f": {d['reason']}" + (f" ({d['stage']}; {d['owner']})" if d.get("owner") else f" ({d['stage']})")
    return text


def table(rows, triage):
    untriaged = 0
    out = ["| library | path | W | K | dtype | two runs | watch | triage |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        differs = r["exit"] != 0 or (r["watch_exit"] not in (0, None))
        t = triage_of(r, triage) if differs else None
        if differs and not t:
            untriaged += 1
        mark = f"{t['kind']}: {t['note']}" if t else ("UNTRIAGED" if differs else "")
        out.append(f"| {r['library']} | {r['path']} | {r['gpus']} | {r['acc_steps']} | {r['dtype']} | "
                   f"{cell(r['exit'], r['two_runs'])} | {cell(r['watch_exit'], r['watch'])} | {mark} |")
    return out, untriaged


def write_table(rows, triage, pins):
    lines, untriaged = table(rows, triage)
    libraries = sorted({r["library"] for r in rows})
    differs = sum(1 for r in rows if r["exit"] != 0 or r["watch_exit"] not in (0, None))
    head = open(TABLE).read().split("<!-- table -->")[0] if os.path.exists(TABLE) else "# The sweep\n\n"
    summary = (f"{len(rows)} configurations across {len(libraries)} libraries ({', '.join(libraries)}); "
               f"{len(rows) - differs} EQUIVALENT under both checks, {differs} differing, {untriaged} untriaged. "
               f"Pins: {', '.join(pins)}.")
    with open(TABLE, "w") as f:
        f.write(head + "<!-- table -->\n" + summary + "\n\n" + "\n".join(lines) + "\n")
    return untriaged


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    at = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--at=")), None)
    if at is not None:
        w, k, dtype = (at.split(",") + ["", "", ""])[:3]
        if not (w.isdigit() and k.isdigit() and dtype in ("float32", "bf16")):
            print(f"sweep: --at={at}: give W,K,DTYPE (DTYPE float32 or bf16), e.g. --at=2,4,float32", file=sys.stderr)
            sys.exit(2)
        at = (int(w), int(k), dtype)
    cfg = tomllib.load(open(os.path.join(HERE, "configs.toml"), "rb"))
    triage = tomllib.load(open(os.path.join(HERE, "triage.toml"), "rb")).get("triage", [])
    pins = [line.split("#")[0].strip() for line in open(os.path.join(HERE, "requirements.txt"))]
    pins = [p for p in pins if p]
    known = {p["name"] for p in cfg["path"]} | {p["library"] for p in cfg["path"]}
    unknown = [a for a in args if a not in known]
    if unknown:
        print(f"sweep: no path or library named {', '.join(unknown)} in bench/sweep/configs.toml", file=sys.stderr)
        sys.exit(2)
    previous = json.load(open(RESULTS)) if os.path.exists(RESULTS) else []
    if "--table-only" not in sys.argv:
        binary = os.path.abspath(os.environ.get("DDP_VERIFY", os.path.join(ROOT, "target/debug/ddp-verify")))
        python = os.path.join(ROOT, ".venv-sweep", "bin", "python")
        if not os.access(binary, os.X_OK) or not os.path.exists(python):
            sys.exit("sweep: needs target/debug/ddp-verify (cargo build) and .venv-sweep (bash bench/sweep/setup.sh)")
        keep = os.environ.get("SWEEP_KEEP") or tempfile.mkdtemp(prefix="ddp-verify-sweep-")
        os.makedirs(keep, exist_ok=True)
        merged = {(r["path"], r["gpus"], r["acc_steps"], r["dtype"]): r for r in previous}
        order = [(p["name"], w, k, d) for p, w, k, d in points(cfg, set())]
        for path, w, k, dtype in points(cfg, set(args), at):
            r = run_point(binary, python, path, w, k, dtype, keep)
            merged[(r["path"], w, k, dtype)] = r
            print(f"{r['library']:<12} {r['path']:<26} W={w} K={k} {dtype:<7} {cell(r['exit'], r['two_runs'])}; "
                  f"watch: {cell(r['watch_exit'], r['watch'])}  {r['seconds']} s {r['tail']}", flush=True)
            # Written after every point: an interrupted sweep keeps what it ran.
            previous = [merged[key] for key in order if key in merged]
            with open(RESULTS, "w") as f:
                json.dump(previous, f, indent=1)
        print(f"sweep: reports, logs and traces in {keep}")
    untriaged = write_table(previous, triage, pins)
    print(f"sweep: {len(previous)} configurations in {os.path.relpath(TABLE, ROOT)}, {untriaged} untriaged")
    sys.exit(1 if untriaged else 0)


if __name__ == "__main__":
    main()
