#!/usr/bin/env bash
# The Colossal-AI example's own virtualenv, .venv-torch25; safe to run again (it skips what is
# done). Colossal-AI 0.5.0 pins torch<=2.5.1 and transformers==4.51.3, so it cannot share
# .venv (torch 2.13.0). Installs:
#  - python/requirements-torch25.txt: torch 2.5.1, colossalai 0.5.0 with what pip resolves for
#    it (nothing forced), safetensors and pytest; about 2 minutes and 5.9 GB the first time
#  - the ddp_verify_trace recorder: by default this checkout's python/ on the path (a .pth
#    file, so the venv always runs python/'s source and nothing is built); given a wheel,
#    that wheel instead, the `ddp-verify` command with it
#    (`scripts/setup-torch25.sh "$(scripts/build-wheel.sh | tail -n 1)"`)
#
#   scripts/setup-torch25.sh [WHEEL]     (PYTHON=python3.11 to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# shellcheck source=scripts/uv.sh
. scripts/uv.sh

venv=.venv-torch25
req=python/requirements-torch25.txt
# The recorder's distribution name (as pip lists it), for a wheel's install and removal.
recorder_dist=${RECORDER_DIST:-ddp-verify}
wheel=${1:-}
if [ -n "$wheel" ] && [ ! -f "$wheel" ]; then
  echo "setup-torch25: no wheel at $wheel" >&2
  exit 2
fi

# Exactly the pinned versions, or they are installed again.
if ! "$venv/bin/python" -W ignore -c '
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        assert m.version(name) == version, name' "$req" 2>/dev/null; then
  echo "setup-torch25: installing $req into $venv (uv, about 50 s and 5.9 GB the first time)"
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  uv_install "$venv/bin/python" -r "$req"
fi

purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pth="$purelib/ddp_verify_trace_checkout.pth"
installed() { "$venv/bin/python" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$recorder_dist" 2>/dev/null; }

if [ -n "$wheel" ]; then
  # The wheel given, once: its hash is kept beside the venv, so another build is installed again.
  sum=$(sha256sum "$wheel" | cut -d' ' -f1)
  if [ "$(cat "$venv/.recorder-wheel" 2>/dev/null)" != "$sum" ] || ! installed; then
    echo "setup-torch25: installing the recorder from $wheel into $venv"
    rm -f "$pth"
    if installed; then "$venv/bin/pip" uninstall -q -y "$recorder_dist"; fi
    "$venv/bin/pip" install -q --disable-pip-version-check "$wheel"
    echo "$sum" >"$venv/.recorder-wheel"
  fi
else
  # This checkout's python/ on the path; a recorder installed from a wheel goes first.
  if ! "$venv/bin/python" -W ignore -c '
import os, ddp_verify_trace
assert os.path.realpath(ddp_verify_trace.__file__) == os.path.realpath("python/ddp_verify_trace/__init__.py")' 2>/dev/null; then
    echo "setup-torch25: putting this checkout's recorder (python/) on $venv's path"
    if installed; then "$venv/bin/pip" uninstall -q -y "$recorder_dist"; fi
    rm -f "$venv/.recorder-wheel"
    echo "$PWD/python" >"$pth"
  fi
fi

"$venv/bin/python" -W ignore -c 'import torch, colossalai, ddp_verify_trace'
echo "setup-torch25: $venv ready ($(du -sh "$venv" | cut -f1), $(($(date +%s) - start)) s)"
