#!/usr/bin/env bash
# Speed against the Python reference, side by side on this machine (see bench/compare.py).
#   bench/compare.sh [--runs N] [--json PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
cargo build -q --bins --example pure_compute
exec .venv/bin/python -W ignore bench/compare.py "$@"
