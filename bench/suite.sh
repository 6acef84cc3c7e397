#!/usr/bin/env bash
# A suite against the same cases run one by one: the suite starts its ranks once.
#   bench/suite.sh [SUITE.toml] [--runs N]     (default: examples/suite.toml, 3 runs)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
cargo build -q --bins
exec python3 bench/suite.py "$@"
