#!/usr/bin/env bash
# Runs a command and prints, in MiB, the sum over it and all its descendants of each
# process's peak RSS (VmHWM, read from /proc every 50 ms while they live). Each process's
# own high-water mark is exact, so the sum does not depend on catching a transient peak
# (ranks under mpirun are descendants of the launcher).
#   bench/peak_rss.sh CMD ARGS...
set -euo pipefail
"$@" > /dev/null &
root=$!
declare -A hwm
tree() { local p=$1; echo "$p"; for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do tree "$c"; done; }
while kill -0 "$root" 2>/dev/null; do
  for p in $(tree "$root"); do
    kb=$(awk '/^VmHWM/ {print $2}' /proc/"$p"/status 2>/dev/null || true)
    if [ -n "${kb:-}" ] && [ "$kb" -gt "${hwm[$p]:-0}" ]; then hwm[$p]=$kb; fi
  done
  sleep 0.05
done
wait "$root" || true
total=0
for kb in "${hwm[@]}"; do total=$((total + kb)); done
echo "$((total / 1024))"
