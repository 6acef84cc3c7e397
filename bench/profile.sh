#!/usr/bin/env bash
# Where one run's time goes: runs ddp-verify with DDP_VERIFY_PROFILE and prints every
# process's phase marks (launcher, each rank, rank 0's accumulation thread) in seconds
# since the command started.
#   bench/profile.sh [ddp-verify flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --bins
marks=$(mktemp)
trap 'rm -f "$marks"' EXIT
start=$(date +%s.%N)
DDP_VERIFY_PROFILE="$marks" target/debug/ddp-verify "$@" >/dev/null
end=$(date +%s.%N)
sort -n "$marks" | awk -v t0="$start" '{ printf "%7.3f  %-8s %s\n", $1 - t0, $2, substr($0, index($0, $3)) }'
awk -v a="$start" -v b="$end" 'BEGIN { printf "%7.3f  exit\n", b - a }'
