"""Wall time of `ddp-verify suite FILE` against each of its cases run alone (the command
each case's JSON report gives), median of --runs; prints the ratio."""
import argparse
import json
import statistics
import subprocess
import tempfile
import time

EXE = "target/debug/ddp-verify"


def wall(argv):
    t = time.perf_counter()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("suite", nargs="?", default="examples/suite.toml")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        report = f"{d}/suite.json"
        subprocess.run([EXE, "suite", args.suite, "--report", "json", "--report-file", report], check=True)
        cases = json.load(open(report))["cases"]
    commands = [c["command"].split()[1:] for c in cases]
    suite = statistics.median(wall([EXE, "suite", args.suite]) for _ in range(args.runs))
    alone = statistics.median(sum(wall([EXE, *c]) for c in commands) for _ in range(args.runs))
    print(f"suite of {len(cases)} cases ({args.suite}): {suite:.2f} s")
    print(f"the same {len(cases)} cases run one by one: {alone:.2f} s")
    print(f"ratio: the suite takes {suite / alone:.2f}x the time ({alone / suite:.1f}x faster)")


if __name__ == "__main__":
    main()
