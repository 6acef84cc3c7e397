#!/usr/bin/env bash
# The sweep's virtualenv, .venv-sweep: bench/sweep/requirements.txt's pins (the libraries'
# current releases over the current torch), the recorder's dependencies, and this checkout's
# recorder (python/) on its path through a .pth file, as .venv has it. Safe to run again.
# About a minute the first time on 2 cores (uv; torch's wheel hardlinked from uv's cache).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/uv.sh
. scripts/uv.sh
venv=.venv-sweep
pins=bench/sweep/requirements.txt
if ! "$venv/bin/python" -W ignore - "$pins" <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        assert m.version(name) == version, name
import ddp_verify_trace
PY
  echo "sweep setup: installing $pins into $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  mapfile -t deps < <(python3 -c '
import tomllib
print(*tomllib.load(open("python/pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")')
  uv_install "$venv/bin/python" -r "$pins" "${deps[@]}"
  purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  realpath python >"$purelib/ddp_verify_trace_checkout.pth"
fi
"$venv/bin/python" -W ignore -c 'import torch, trl, peft, ddp_verify_trace; print(f"sweep setup: .venv-sweep ready, torch {torch.__version__}, trl {trl.__version__}, peft {peft.__version__}")'
