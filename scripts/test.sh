#!/usr/bin/env bash
# Every test: installs what they need (scripts/setup.sh), runs the recorder's pytest suite and
# each crate's unit tests (also built without libtorch), the wheel's checks (built without
# libtorch; installed beside torch 2.13, and beside torch 2.5.1 with Colossal-AI 0.5.0 in
# .venv-torch25, where nanoGPT and seed 004's loop run), the shipped-bug corpus's environments,
# then the integration tests last (the corpus among them), so a
# log ends on their summary (no empty doc-test run), and the users' examples once more with
# their traces sampled.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The recorder's tests first: seconds, and they need no build.
.venv/bin/python -m pytest -q python/tests
cargo test --workspace --lib --bins --examples
# The build without libtorch, in its own target directory (the full build's binaries stay).
CARGO_TARGET_DIR=target/light cargo test -q -p ddp-verify --no-default-features --lib --bins
wheel=$(scripts/build-wheel.sh | tail -n 1)
# CI (DDP_VERIFY_LEAN=1, .ci/run) frees the disk those builds held before two torch venvs land.
if [ -n "${DDP_VERIFY_LEAN:-}" ]; then
  rm -rf target/light target/wheel
  df -h . | tail -n 1 | awk '{print "test.sh: " $4 " free on " $6 " before the torch 2.5.1 and 2.8.0 venvs (about 12.5 GB)"}'
fi
scripts/check-wheel.sh "$wheel" .venv/bin/python
scripts/setup-torch25.sh "$wheel"
scripts/check-torch25.sh
# The shipped-bug corpus's environments (tests/shipped/cases.toml: framework pins over .venv
# and .venv-torch25, and torch 2.8.0's own venv), for the integration test shipped::.
scripts/setup-shipped.sh
cargo test --test integration
# Several hosts on one machine (network namespaces) need root: run where root, else said.
if [ "$(id -u)" = 0 ]; then
  cargo test --test integration -- --ignored hosts::
else
  echo "test.sh: hosts:: not run: not root (ip netns and unshare need root)"
fi
# Every example's legs again with sampled traces (16 elements of each tensor larger than that,
# and each whole tensor's summaries): the same verdicts and causes. Colossal-AI's run sampled in
# check-torch25.sh.
DDP_VERIFY_SAMPLE=16 cargo test --test integration -- user_loops:: own_loop::
