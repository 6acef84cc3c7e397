#!/usr/bin/env bash
# Runs the shipped-bug corpus (tests/shipped/cases.toml) through ddp-verify: each case's buggy
# version must come out NOT EQUIVALENT (exit 1) and its fixed version EQUIVALENT (exit 0).
# One row per run: case, version, exit code, diagnosis.reason, seconds. Environments first:
# scripts/setup-shipped.sh.
#
#   scripts/shipped.sh [CASE...]    DDP_VERIFY=BIN (default target/debug/ddp-verify); see
#                                   tests/shipped/run.py for the other variables
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 tests/shipped/run.py "$@"
