#!/usr/bin/env bash
# Runs a command and prints the peak of the summed RSS (MiB) of it and all its descendants,
# sampled every 50 ms from /proc (ranks under mpirun are descendants of the launcher).
#   bench/peak_rss.sh CMD ARGS...
set -euo pipefail
"$@" > /dev/null &
root=$!
peak=0
tree() { local p=$1; echo "$p"; for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do tree "$c"; done; }
while kill -0 "$root" 2>/dev/null; do
  total=0
  for p in $(tree "$root"); do
    kb=$(awk '/^VmRSS/ {print $2}' /proc/"$p"/status 2>/dev/null || true)
    total=$((total + ${kb:-0}))
  done
  (( total > peak )) && peak=$total
  sleep 0.05
done
wait "$root" || true
echo "$((peak / 1024))"
