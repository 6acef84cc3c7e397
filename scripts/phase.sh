# Sourced by .ci/run and scripts/test.sh: `phase WHAT` prints the seconds since the last mark
# (the sourcing, at first) and since the start, as "PREFIX: phase WHAT: 12 s (at 345 s)".
phase_prefix=${phase_prefix:-$(basename "$0")}
phase_start=$(date +%s)
phase_last=$phase_start
phase() {
  local now
  now=$(date +%s)
  echo "$phase_prefix: phase $1: $((now - phase_last)) s (at $((now - phase_start)) s)"
  phase_last=$now
}
