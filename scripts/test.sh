#!/usr/bin/env bash
# Every test: installs what they need (scripts/setup.sh), runs each crate's unit tests (also
# built without libtorch), the recorder's pytest suite on the current torch release
# (.venv-current, scripts/setup-current.sh), the wheel's checks (built without libtorch;
# installed beside the current torch, and beside torch 2.5.1 with Colossal-AI 0.5.0 in
# .venv-torch25, where nanoGPT and seed 004's loop run), the shipped-bug corpus's environments,
# then the integration tests last (the corpus among them; about half the users' examples'
# cases with their traces sampled), so a log ends on their summary (no empty doc-test run).
# Each phase's time is printed ("test.sh: phase ...").
set -euo pipefail
cd "$(dirname "$0")/.."
phase_prefix=test.sh
# shellcheck source=scripts/phase.sh
. scripts/phase.sh
./scripts/setup.sh
# The other torch venvs download (uv, network-bound) while the builds below compile: logged,
# and waited for where first needed.
mkdir -p target
venvs_log=target/venvs.log
(scripts/setup-current.sh && scripts/setup-torch25.sh && scripts/setup-shipped.sh) >"$venvs_log" 2>&1 &
venvs=$!
venvs_ready() {
  if ! wait "$venvs"; then
    cat "$venvs_log" >&2
    echo "test.sh: setting up .venv-current, .venv-torch25 or the shipped corpus's environments failed" >&2
    exit 1
  fi
  cat "$venvs_log"
}
phase "setup (.venv)"
cargo test --workspace --lib --bins --examples
phase "unit tests"
# The build without libtorch, in its own target directory (the full build's binaries stay).
CARGO_TARGET_DIR=target/light cargo test -q -p ddp-verify --no-default-features --lib --bins
phase "unit tests without libtorch"
wheel=$(scripts/build-wheel.sh | tail -n 1)
phase "wheel built"
venvs_ready
phase "venvs (their wait)"
# The recorder's tests, on the current torch: two workers (pytest-xdist), as most tests are one
# Python process, which leaves the second core idle (208 s in place of about 300 s). Its torch
# 2.13 is run by the integration tests (the shipped corpus over .venv, compare, explore, the
# culprits' loop, DeepSpeed under torchrun), its torch 2.5.1 by scripts/check-torch25.sh.
.venv-current/bin/python -m pytest -q -n 2 python/tests
phase "recorder's tests, the current torch"
# CI (DDP_VERIFY_LEAN=1, .ci/run) frees the disk those builds held.
if [ -n "${DDP_VERIFY_LEAN:-}" ]; then
  rm -rf target/light target/wheel
  df -h . | tail -n 1 | awk '{print "test.sh: " $4 " free on " $6}'
fi
scripts/check-wheel.sh "$wheel" .venv-current/bin/python
scripts/setup-torch25.sh "$wheel"
scripts/check-torch25.sh
phase "the wheel's checks"
# The integration tests with each one's time (libtest's --report-time, unstable: allowed for the
# test binary alone by RUSTC_BOOTSTRAP in its environment, so nothing is built otherwise),
# then the slowest 15: where CI's minutes go.
it_log=target/integration.log
integration=$(cargo test --test integration --no-run --message-format=json-render-diagnostics \
  | python3 -c 'import json, sys
print(*[j["executable"] for j in map(json.loads, sys.stdin)
        if j.get("reason") == "compiler-artifact" and j["target"]["name"] == "integration" and j.get("executable")])')
set +e
RUSTC_BOOTSTRAP=1 "$integration" -Z unstable-options --report-time 2>&1 | tee "$it_log"
it_rc=${PIPESTATUS[0]}
set -e
echo "test.sh: the slowest integration tests (seconds):"
sed -nE 's/^test (.*) \.\.\. ok <([0-9.]+)s>$/\2 \1/p' "$it_log" | sort -rn | head -n 15
[ "$it_rc" -eq 0 ] || exit "$it_rc"
phase "integration tests"
# Several hosts on one machine (network namespaces) need root: run where root, else said.
if [ "$(id -u)" = 0 ]; then
  cargo test --test integration -- --ignored hosts::
else
  echo "test.sh: hosts:: not run: not root (ip netns and unshare need root)"
fi
phase "two hosts"
