#!/usr/bin/env bash
# Every test: installs what they need (scripts/setup.sh), runs the recorder's pytest suite and
# each crate's unit tests, then the integration tests last, so a log ends on their summary (no
# empty doc-test run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The recorder's tests first: seconds, and they need no build.
.venv/bin/python -m pytest -q python/tests
cargo test --workspace --lib --bins --examples
cargo test --test integration
