#!/usr/bin/env bash
# The current torch release's virtualenv, .venv-current; safe to run again (it skips what is
# done). python/requirements-current.txt's torch (2.15.0) in place of requirements-frameworks.txt's
# torch==2.13.0 (uv's --override), those frameworks at their pins, the recorder's dependencies
# (python/pyproject.toml) and pytest, and this checkout's recorder (python/) on its path through
# a .pth file, as .venv has it. About 40 s the first time (uv); its CUDA libraries' wheels are
# hardlinked from uv's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# shellcheck source=scripts/uv.sh
. scripts/uv.sh
venv=.venv-current
current=python/requirements-current.txt

# Every pin at its version, requirements-current.txt's over requirements-frameworks.txt's.
if ! "$venv/bin/python" -W ignore - "$current" python/requirements-frameworks.txt python/requirements-test.txt <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
pins = {}
for path in sys.argv[2:] + sys.argv[1:2]:  # the frameworks' and tests' pins, then the current torch
    for line in open(path):
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name] = version
for name, version in pins.items():
    assert m.version(name) == version, name
import ddp_verify_trace
PY
  echo "setup-current: installing $current's torch and the frameworks into $venv (uv, about 40 s the first time)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  mapfile -t deps < <(python3 -c '
try: import tomllib
except ImportError: from pip._vendor import tomli as tomllib  # Python < 3.11
print(*tomllib.load(open("python/pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")')
  uv_install "$venv/bin/python" -r python/requirements-frameworks.txt -r python/requirements-test.txt \
    "${deps[@]}" --override "$current"
  purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  realpath python >"$purelib/ddp_verify_trace_checkout.pth"
fi
"$venv/bin/python" -W ignore -c 'import torch, ddp_verify_trace; print(f"setup-current: '"$venv"' ready, torch {torch.__version__}")' | tr -d '\n'
echo " ($(($(date +%s) - start)) s)"
