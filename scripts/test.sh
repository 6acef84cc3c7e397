#!/usr/bin/env bash
# Every test: installs what they need (scripts/setup.sh), runs each crate's unit tests, then
# the integration tests last, so a log ends on their summary (no empty doc-test run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test --workspace --lib --bins --examples
cargo test --test integration
