"""What `ddp-verify watch` costs on top of the run it watches: the time to a verdict (one
recorded run, then the judgement of its contracts) against the same launch command recorded
alone, with no judgement; and `watch --stop-on-fault` (rank 0 writes each step's small trace,
judged while the run trains) against it too. The contracts run no code inside a training step
(they read the trace), so the first ratio is the judgement's share; the recorder's own cost
per step is bench/stages_paired.py's. Rounds alternate the two (A B A B ...) so that the machine's
drift falls on both; the ratio is taken per pair and its median quoted.

  .venv/bin/python bench/watch.py [--rounds N] [--cases nanogpt-ddp,fsdp2]
                                  (DDP_VERIFY=BIN, default target/debug/ddp-verify)

Cases: examples/nanogpt under DDP over 2 ranks (torchrun, gloo, K=4), examples/fsdp2 over 2
ranks (K=4). Last line: JSON."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = os.path.join(ROOT, ".venv", "bin", "python")
CASES = {
    "nanogpt-ddp": ["examples/nanogpt/train.py", "--grad-accum", "4", "--epochs", "10"],
    "fsdp2": ["examples/fsdp2/train.py", "--grad-accum", "4", "--epochs", "10"],
}


def command(case: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *CASES[case]]


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds of one run; a run that fails (torchrun's rendezvous on a loaded machine) once
    more."""
    for attempt in (1, 2):
        t0 = time.monotonic()
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if done.returncode in (0, 1) or attempt == 2:
            done.check_returncode() if done.returncode > 1 else None
            return time.monotonic() - t0
    raise AssertionError("unreachable")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", default="nanogpt-ddp,fsdp2")
    args = p.parse_args()
    binary = os.environ.get("DDP_VERIFY", os.path.join(ROOT, "target", "debug", "ddp-verify"))
    autoload = os.path.join(ROOT, "python", "ddp_verify_trace", "autoload")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            watch = [binary, "watch", "--save-trace", tmp, "--force", "--report-file", os.path.join(tmp, "r.txt"),
                     "--", *command(case)]
            recorded = dict(os.environ, PYTHONPATH=os.pathsep.join([autoload, os.path.join(ROOT, "python")]),
                            DDP_VERIFY_TRACE=os.path.join(tmp, "alone.safetensors"), DDP_VERIFY_LEG="ddp")
            recorded.setdefault("OMP_NUM_THREADS", "1")
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
            env.setdefault("OMP_NUM_THREADS", "1")
            stop = [*watch[:2], "--stop-on-fault", *watch[2:]]
            ratios, stops, walls = [], [], []
            timed(command(case), recorded)  # warm-up: caches, compiled kernels
            for _ in range(args.rounds):
                a = timed(watch, env)
                b = timed(command(case), recorded)
                c = timed(stop, env)
                ratios.append(a / b)
                stops.append(c / b)
                walls.append((a, b, c))
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            r = statistics.quantiles(stops, n=4) if len(stops) > 1 else stops * 3
            out[case] = {"ratio": statistics.median(ratios), "middle_half": [q[0], q[2]],
                         "stop_on_fault_ratio": statistics.median(stops), "stop_middle_half": [r[0], r[2]],
                         "watch_s": statistics.median(w[0] for w in walls),
                         "recorded_s": statistics.median(w[1] for w in walls),
                         "stop_on_fault_s": statistics.median(w[2] for w in walls)}
            print(f"{case}: watch / recorded run, wall: {out[case]['ratio']:.3f} [{q[0]:.3f}-{q[2]:.3f}]; "
                  f"--stop-on-fault: {out[case]['stop_on_fault_ratio']:.3f} [{r[0]:.3f}-{r[2]:.3f}] "
                  f"({out[case]['watch_s']:.1f} s, {out[case]['stop_on_fault_s']:.1f} s against "
                  f"{out[case]['recorded_s']:.1f} s)", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
