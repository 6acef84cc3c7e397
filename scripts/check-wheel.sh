#!/usr/bin/env bash
# Installs a `ddp-verify` wheel (scripts/build-wheel.sh's) into a fresh virtualenv and checks
# what a user gets from `pip install ddp-verify`:
#
#   scripts/check-wheel.sh WHEEL PYTHON     # PYTHON: one with torch, e.g. .venv/bin/python
#
# The fresh venv sees PYTHON's site-packages (a .pth file), so torch is not downloaded again;
# nothing else is installed beside the wheel (pip --no-index: torch and safetensors must be
# there already, as the wheel's requirements allow). PYTHON's environment is not changed, and
# the venv is removed at the end. The checks run on a PATH without cargo:
#  - a plain `pip install` of it (its plan, --dry-run) installs it alone: PYTHON's torch stays,
#    whatever release; after the install torch is the one before and `pip check` is clean
#  - `ddp-verify --version` runs; ldd shows no libtorch, MPI, CUDA or NCCL, nor a library not
#    found; the binary has no RPATH/RUNPATH (a path on the machine that built it)
#  - `import ddp_verify_trace` works in that venv, from the venv, with its autoload folder; the
#    wheel, the recorder and `ddp-verify --version` say one version
#  - own-model commands answer in one line, exit 2
#  - `ddp-verify --acc-steps 4 --gpus 2 -- python examples/nanogpt/train.py ...` (the README's
#    check of your own script) finds the venv's recorder and says EQUIVALENT, exit 0; then
#    `compare` on its two traces, and `split`
# It prints the install time and the installed size.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

if [ $# -ne 2 ]; then
  echo "usage: scripts/check-wheel.sh WHEEL PYTHON (a Python with torch, e.g. .venv/bin/python)" >&2
  exit 2
fi
wheel=$(realpath "$1")
base=$2
fail() { echo "check-wheel: FAILED: $*" >&2; exit 1; }

"$base" -W ignore -c 'import torch, safetensors' 2>/dev/null \
  || { echo "check-wheel: $base cannot import torch and safetensors; give a Python that has them" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv=$tmp/venv
# Without a pip or setuptools of its own: PYTHON's are seen (torch requires a recent setuptools).
"$base" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# PYTHON's package folders (its site-packages and what .pth files add there), less the standard
# library and any folder with a ddp_verify_trace (a checkout's python/): only the wheel's is seen.
"$base" -W ignore -c '
import os, sys, sysconfig
std = {os.path.realpath(sysconfig.get_paths()["stdlib"])}
for p in sys.path[1:]:
    r = os.path.realpath(p)
    if os.path.isdir(r) and not any(r == s or r.startswith(s + os.sep) for s in std) \
            and not os.path.exists(os.path.join(r, "ddp_verify_trace")):
        print(r)' > "$site/zz_torch_from_base.pth"

# No cargo, no LD_LIBRARY_PATH or PYTHONPATH of the caller's: the venv first, then the system's.
export PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin"
unset LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV

torch_before=$(python -W ignore -c 'import torch; print(torch.__version__)')
# What a plain `pip install` of the wheel would do (PyPI reachable): install the wheel alone,
# never replace the user's torch (the wheel caps no torch release: python/pyproject.toml).
if python -m pip install -q --dry-run --disable-pip-version-check --report "$tmp/plan.json" "$wheel" 2>"$tmp/plan.err"; then
  python - "$tmp/plan.json" <<'EOF' || fail "a plain pip install of the wheel would change more than itself beside torch $torch_before"
import json, sys
names = sorted(i["metadata"]["name"] for i in json.load(open(sys.argv[1]))["install"])
print(f"check-wheel: a plain pip install would install {names}")
assert names == ["ddp-verify"], names
EOF
else
  echo "check-wheel: no index reachable ($(tail -n 1 "$tmp/plan.err")): the install plan not checked"
fi
start=$EPOCHREALTIME
python -m pip install -q --no-index --disable-pip-version-check "$wheel"
install_s=$(python -c "print(f'{$EPOCHREALTIME - $start:.1f}')")

[ "$(python -W ignore -c 'import torch; print(torch.__version__)')" = "$torch_before" ] || fail "installing the wheel changed torch $torch_before"
python -m pip check --disable-pip-version-check || fail "pip check: the wheel's requirements beside torch $torch_before"
bin=$(command -v ddp-verify) || fail "pip put no ddp-verify on the venv's PATH"
[ "$bin" = "$venv/bin/ddp-verify" ] || fail "ddp-verify is $bin, not the venv's"

echo "check-wheel: ddp-verify --version"
version=$(ddp-verify --version) || fail "ddp-verify --version exited $?"
echo "$version"

libs=$(ldd "$bin")
echo "$libs"
if grep -Eiq 'torch|mpi|cuda|nccl|not found' <<<"$libs"; then fail "ddp-verify links more than libc: $libs"; fi
if command -v readelf >/dev/null; then
  if readelf -d "$bin" | grep -Eq 'RPATH|RUNPATH'; then
    fail "ddp-verify carries a search path of the machine that built it: $(readelf -d "$bin" | grep -E 'RPATH|RUNPATH')"
  fi
else
  echo "check-wheel: no readelf here: RPATH/RUNPATH not checked"
fi

echo "check-wheel: import ddp_verify_trace"
python -W ignore - "$venv" "$version" <<'EOF' || fail "ddp_verify_trace is not the wheel's in the venv, or a version differs"
import importlib.metadata as m, os, sys
import ddp_verify_trace
venv = os.path.realpath(sys.argv[1])
here = os.path.realpath(ddp_verify_trace.__file__)
assert here.startswith(venv + os.sep), f"ddp_verify_trace from {here}, not from {venv}"
autoload = os.path.join(os.path.dirname(here), "autoload", "sitecustomize.py")
assert os.path.isfile(autoload), f"no {autoload}"
# One version: the wheel's (python/pyproject.toml), the recorder's and the binary's (Cargo's).
versions = {"wheel": m.version("ddp-verify"), "ddp_verify_trace.__version__": ddp_verify_trace.__version__,
            "ddp-verify --version": sys.argv[2].split()[-1]}
assert len(set(versions.values())) == 1, f"versions differ: {versions}"
print(f"ddp_verify_trace {ddp_verify_trace.__version__} from {here}")
EOF

echo "check-wheel: an own-model command says in one line how to get it (exit 2)"
set +e
ddp-verify --acc-steps 2 --gpus 2 --epochs 1 >"$tmp/own.out" 2>"$tmp/own.err"
code=$?
set -e
cat "$tmp/own.err"
[ "$code" -eq 2 ] && [ "$(wc -l <"$tmp/own.err")" -eq 1 ] || fail "own-model run: exit $code, $(wc -l <"$tmp/own.err") lines"

echo "check-wheel: ddp-verify --acc-steps 4 --gpus 2 -- python examples/nanogpt/train.py --grad-accum {acc_steps}"
set +e
(cd "$tmp" && ddp-verify --acc-steps 4 --gpus 2 --save-trace "$tmp/legs" \
  -- python "$repo/examples/nanogpt/train.py" --grad-accum '{acc_steps}') >"$tmp/script.out" 2>"$tmp/script.err"
code=$?
set -e
tail -n 3 "$tmp/script.out"
[ "$code" -eq 0 ] && grep -q '^EQUIVALENT' "$tmp/script.out" \
  || fail "the own-script check: exit $code; $(tail -n 5 "$tmp/script.err")"

echo "check-wheel: ddp-verify compare (the two traces just recorded) and split"
ddp-verify compare "$tmp/legs/accumulation.safetensors" "$tmp/legs/ddp.safetensors" >"$tmp/compare.out" \
  || fail "compare: exit $?"
tail -n 1 "$tmp/compare.out"
ddp-verify split --shuffle --json >/dev/null || fail "split: exit $?"

installed=$(python - <<'EOF'
import importlib.metadata as m
print(sum(f.size or 0 for f in m.distribution("ddp-verify").files))
EOF
)
echo "check-wheel: OK: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB; installed in $install_s s (torch already there), $(( installed / 1024 )) KiB installed"
