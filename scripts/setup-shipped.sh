#!/usr/bin/env bash
# The environments of the shipped-bug corpus (tests/shipped/cases.toml); safe to run again: an
# environment whose marker names the same base and pins, and whose pins import, is skipped.
# One line per environment it builds. Needs .venv (scripts/setup.sh) and, for cases on torch
# 2.5.1, .venv-torch25 (scripts/setup-torch25.sh); builds nothing in either.
#
# Kinds of environment (tests/shipped/manifest.py lists them):
#  - overlay: a case's framework pins over a torch virtualenv that exists already, without
#    installing torch again and without --no-deps: a small venv (no pip of its own) whose
#    site-packages holds a .pth that adds the base venv's site-packages *after* its own
#    (`site.addsitedir`, so the base's own .pth files count too). pip, run for that Python,
#    sees torch and the rest of the base installed and installs only what the pins need, into
#    the small venv; a package the base has at another version is installed beside it ("Not
#    uninstalling ... outside environment") and shadows it, the small venv's site-packages
#    coming first on sys.path. Checked after each build: every pin imports from the overlay
#    at its pinned version, and torch is the base's.
#  - torch: a torch virtualenv of its own (a case whose bug is in torch), from [envs.X]
#    requirements, outside the checkout (SHIPPED_TORCH_ENVS, ~/.cache/ddp-verify-shipped/):
#    it depends on nothing in the checkout, so every clone on the machine (CI's fresh ones)
#    shares it, and the slow part (torch 2.8.0: 6.5 GB, 3 to 8 minutes here) is paid once.
#    SHIPPED_SKIP_TORCH_ENVS=1 builds none (and scripts/shipped.sh runs none of their cases).
# An overlay gets this checkout's recorder (python/) on its path, ahead of a recorder
# installed in the base (a wheel in .venv-torch25); scripts/shipped.sh puts it first on
# PYTHONPATH for every run.
#
# Time: the pins are first made wheels with .venv's pip (`pip wheel --no-deps`: DeepSpeed
# ships an sdist, which builds in ~10 s there but ~40 s for an overlay's Python, whose build
# sees torch and probes its ops), then the environments are built at once, in parallel
# (network-bound: torch's own venv is ~3 minutes and 6.5 GB of downloads, an overlay 5-20 s).
#
#   scripts/setup-shipped.sh [CASE...]      (SHIPPED_ENVS=DIR: where overlays go, .venv-shipped/;
#                                            SHIPPED_TORCH_ENVS=DIR: torch envs;
#                                            DDP_VERIFY_VENV_<ENV>=DIR: another base venv)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
root=$PWD
# shellcheck source=scripts/uv.sh
. scripts/uv.sh
uv_ready
envs_dir=${SHIPPED_ENVS:-$root/.venv-shipped}
pip_of_main=$root/.venv/bin/pip
if [ ! -x "$pip_of_main" ]; then
  echo "setup-shipped: no .venv: run scripts/setup.sh first" >&2
  exit 2
fi
mkdir -p "$envs_dir/.logs"
# Never committed: a folder that ignores itself.
[ -f "$envs_dir/.gitignore" ] || echo '*' >"$envs_dir/.gitignore"
recorder=$(realpath python)
pip_flags=(-q --disable-pip-version-check)

purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# check PYTHON REQS...: every `name==version` installed at that version for PYTHON, found in
# PYTHON's own venv unless it is torch (a torch env's own, an overlay's base's); then (unless
# QUICK=1: an environment already built) torch and the recorder imported.
check() {
  local py=$1
  shift
  "$py" -W ignore - "$@" <<'EOF'
import importlib.metadata as m, os, sys, sysconfig
own = os.path.realpath(sysconfig.get_paths()["purelib"])
for req in sys.argv[1:]:
    name, _, version = req.partition("==")
    dist = m.distribution(name)
    assert dist.version == version, f"{name} {dist.version}, not {version}"
    where = os.path.realpath(str(dist.locate_file("")))
    if name != "torch":
        assert where == own, f"{name} {version} from {where}, not {own}"
if os.environ.get("QUICK") != "1":
    import torch, ddp_verify_trace
EOF
}

# build_torch NAME VENV REQS...: a torch virtualenv of its own.
build_torch() {
  local name=$1 venv=$2
  shift 2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv --without-pip "$venv"
  # uv: torch's wheels in parallel, from the cache the other venvs share.
  uv_install "$venv/bin/python" "$@"
  # No recorder of its own: clones share it, and scripts/shipped.sh puts theirs on PYTHONPATH.
  PYTHONPATH=$recorder check "$venv/bin/python" "$@"
}

# build_overlay DIR BASE_VENV PINS...: the pins over BASE_VENV's site-packages.
build_overlay() {
  local dir=$1 base=$2
  shift 2
  local base_site site
  base_site=$(purelib "$base/bin/python")
  rm -rf "$dir"
  "$base/bin/python" -m venv --without-pip "$dir"
  site=$(purelib "$dir/bin/python")
  # .pth files are read in name order: the recorder, then the base's site-packages.
  echo "$recorder" >"$site/00-ddp-verify-checkout.pth"
  echo "import site; site.addsitedir('$base_site')" >"$site/zz-shipped-base.pth"
  "$pip_of_main" --python "$dir/bin/python" install "${pip_flags[@]}" --find-links "$envs_dir/.wheels" "$@"
  check "$dir/bin/python" "$@"
}

# What is to be built: NAME KIND BASE REQS, the torch envs first.
todo=()
declare -A marker_of want_of
while IFS=$'\t' read -r name kind base reqs; do
  read -r -a reqs_a <<<"$reqs"
  case $kind in
    base)
      if ! "$base/bin/python" -W ignore -c 'import torch' 2>/dev/null; then
        echo "setup-shipped: no torch virtualenv at $base for [envs.$name] (scripts/setup.sh, scripts/setup-torch25.sh)" >&2
        exit 2
      fi
      ;;
    torch)
      marker="$base/.shipped-env"
      want="torch env: $reqs"
      py="$base/bin/python"
      ;;
    overlay)
      marker="$envs_dir/$name/.shipped-env"
      want="overlay on $base: $reqs"
      py="$envs_dir/$name/bin/python"
      ;;
  esac
  if [ "$kind" = base ]; then
    continue
  fi
  if [ "$(cat "$marker" 2>/dev/null)" = "$want" ] && QUICK=1 check "$py" "${reqs_a[@]}" 2>/dev/null; then
    continue
  fi
  todo+=("$name"$'\t'"$kind"$'\t'"$base"$'\t'"$reqs")
  marker_of[$name]=$marker
  want_of[$name]=$want
done < <(python3 tests/shipped/manifest.py envs "$@")

if [ ${#todo[@]} -eq 0 ]; then
  echo "setup-shipped: environments ready in $envs_dir (nothing to build, $(($(date +%s) - start)) s)"
  exit 0
fi

# The overlays' pins as wheels, once (only what is not a wheel on PyPI is built here).
pins=()
for entry in "${todo[@]}"; do
  IFS=$'\t' read -r name kind base reqs <<<"$entry"
  if [ "$kind" = overlay ]; then
    read -r -a more <<<"$reqs"
    pins+=("${more[@]}")
  fi
done
if [ ${#pins[@]} -gt 0 ]; then
  mapfile -t pins < <(printf '%s\n' "${pins[@]}" | sort -u)
  # One pip per pin (two versions of a package cannot share one resolution), all at once.
  wheel_pids=()
  for pin in "${pins[@]}"; do
    "$pip_of_main" wheel "${pip_flags[@]}" --no-deps -w "$envs_dir/.wheels" "$pin" >"$envs_dir/.logs/wheel-$pin.log" 2>&1 &
    wheel_pids+=($!)
  done
  for i in "${!pins[@]}"; do
    if ! wait "${wheel_pids[$i]}"; then
      echo "setup-shipped: FAILED to fetch or build ${pins[$i]}:" >&2
      tail -n 20 "$envs_dir/.logs/wheel-${pins[$i]}.log" >&2
      exit 1
    fi
  done
fi

# One background job per environment; an overlay over a torch env being built waits for it.
declare -A pid_of t0_of
failed=0
run_job() {
  local name=$1 kind=$2 base=$3 reqs=$4 log="$envs_dir/.logs/$1.log"
  local -a reqs_a
  read -r -a reqs_a <<<"$reqs"
  t0_of[$name]=$(date +%s)
  rm -f "$log.end"
  if [ "$kind" = torch ]; then
    { build_torch "$name" "$base" "${reqs_a[@]}" && date +%s >"$log.end"; } >"$log" 2>&1 &
  else
    { build_overlay "$envs_dir/$name" "$base" "${reqs_a[@]}" && date +%s >"$log.end"; } >"$log" 2>&1 &
  fi
  pid_of[$name]=$!
}
finish() {
  local name=$1 kind=$2 base=$3 reqs=$4 size took
  if wait "${pid_of[$name]}"; then
    echo "${want_of[$name]}" >"${marker_of[$name]}"
    took=$(($(cat "$envs_dir/.logs/$name.log.end") - ${t0_of[$name]}))
    if [ "$kind" = torch ]; then
      size=$(du -sh "$base" | cut -f1)
      echo "setup-shipped: built $name ($reqs) in $took s, $size"
    else
      size=$(du -sh "$envs_dir/$name" | cut -f1)
      echo "setup-shipped: built $name over $base ($reqs) in $took s, $size"
    fi
  else
    echo "setup-shipped: FAILED $name ($reqs); its log, $envs_dir/.logs/$name.log:" >&2
    tail -n 20 "$envs_dir/.logs/$name.log" >&2
    failed=1
  fi
}
declare -A building
for entry in "${todo[@]}"; do
  IFS=$'\t' read -r name kind base reqs <<<"$entry"
  if [ "$kind" = torch ]; then
    run_job "$name" "$kind" "$base" "$reqs"
    building[$base]=$name
  fi
done
for entry in "${todo[@]}"; do
  IFS=$'\t' read -r name kind base reqs <<<"$entry"
  if [ "$kind" = overlay ] && [ -z "${building[$base]:-}" ]; then
    run_job "$name" "$kind" "$base" "$reqs"
  fi
done
# Overlays over the torch envs just built, once each is done.
for entry in "${todo[@]}"; do
  IFS=$'\t' read -r name kind base reqs <<<"$entry"
  if [ "$kind" = torch ]; then
    finish "$name" "$kind" "$base" "$reqs"
    for other in "${todo[@]}"; do
      IFS=$'\t' read -r oname okind obase oreqs <<<"$other"
      if [ "$okind" = overlay ] && [ "$obase" = "$base" ]; then
        run_job "$oname" "$okind" "$obase" "$oreqs"
      fi
    done
  fi
done
for entry in "${todo[@]}"; do
  IFS=$'\t' read -r name kind base reqs <<<"$entry"
  if [ "$kind" = overlay ]; then
    finish "$name" "$kind" "$base" "$reqs"
  fi
done
if [ "$failed" -ne 0 ]; then
  exit 1
fi
echo "setup-shipped: environments ready in $envs_dir (${#todo[@]} built, $(($(date +%s) - start)) s)"
