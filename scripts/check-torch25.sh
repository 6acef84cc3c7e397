#!/usr/bin/env bash
# Runs ddp-verify on the examples under torch 2.5.1 (.venv-torch25, made by
# scripts/setup-torch25.sh) and checks each verdict: the nanoGPT loop honest and with
# `--bug sync-after-forward` (whole traces), the Colossal-AI loop honest and with its two bugs
# (sampled traces: --sample 16, and the report must say so). One line per case with its time;
# exits 1 on any exit code or diagnosis other than expected.
#
#   scripts/check-torch25.sh [BIN]   BIN: a ddp-verify binary (ddp-verify-core beside it);
#                                    by default the ddp-verify on .venv-torch25's PATH
set -uo pipefail
cd "$(dirname "$0")/.."

venv=$PWD/.venv-torch25
if [ ! -x "$venv/bin/python" ]; then
  echo "check-torch25: no $venv: run scripts/setup-torch25.sh first" >&2
  exit 2
fi
bin=${1:-$(PATH="$venv/bin:$PATH" command -v ddp-verify || true)}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "check-torch25: no ddp-verify binary${1:+ at $1}: give its path (target/debug/ddp-verify)" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
start=$(date +%s.%N)
# Flags every case gets: --sample N for the sampled ones.
sample=()

# check NAME EXIT REASON COMMAND...: runs `BIN ... -- COMMAND` (K=4, W=2) and holds its exit
# code and the report's diagnosis.reason ("none" where it has none). A leg failing (exit 3:
# torchrun's rendezvous on a loaded machine) is run once more, as tests/it/user_loops.rs does.
check() {
  local name=$1 want_exit=$2 want_reason=$3
  shift 3
  local report="$tmp/$name.json" log="$tmp/$name.log" t0 rc reason
  t0=$(date +%s.%N)
  for try in 1 2; do
    rm -f "$report"
    "$bin" --acc-steps 4 --gpus 2 "${sample[@]}" --report json --report-file "$report" -- "$@" >"$log" 2>&1
    rc=$?
    [ "$rc" -eq 3 ] && [ "$try" -eq 1 ] || break
    echo "  $name: a leg failed (exit 3), running again: $(tail -n 1 "$log")"
  done
  reason=$("$venv/bin/python" -c '
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except OSError:
    print("(no report)")
else:
    reason = ((r.get("diagnosis") or {}).get("reason")) or "none"
    kept = (r.get("traces") or {}).get("sampling")
    print(reason if (kept is not None) == (len(sys.argv) > 2) else reason + " (sampling not as asked)")' \
    "$report" "${sample[@]:1}")
  local took
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq "$want_exit" ] && [ "$reason" = "$want_reason" ]; then
    printf 'ok    %-28s exit %s  reason %-26s %6ss\n' "$name" "$rc" "\"$reason\"" "$took"
  else
    printf 'FAIL  %-28s exit %s  reason %-26s %6ss  (wanted exit %s, reason "%s")\n' \
      "$name" "$rc" "\"$reason\"" "$took" "$want_exit" "$want_reason"
    tail -n 20 "$log" | sed 's/^/      /'
    failed=1
  fi
}

py=$venv/bin/python
torchrun=$venv/bin/torchrun
echo "check-torch25: $bin, torch $("$py" -c 'import torch; print(torch.__version__)'), Colossal-AI $("$py" -W ignore -c 'import importlib.metadata as m; print(m.version("colossalai"))')"
check nanogpt-honest 0 none "$py" examples/nanogpt/train.py --grad-accum '{acc_steps}'
check nanogpt-sync-after-forward 1 "unsynchronised gradient" \
  "$py" examples/nanogpt/train.py --grad-accum '{acc_steps}' --bug sync-after-forward
sample=(--sample 16)
check colossalai-honest 0 none "$torchrun" examples/colossalai/train.py --grad-accum '{acc_steps}'
check colossalai-loss-not-divided 1 "loss scaling" \
  "$torchrun" examples/colossalai/train.py --grad-accum '{acc_steps}' --bug loss-not-divided
check colossalai-step-condition 1 "step count" \
  "$torchrun" examples/colossalai/train.py --grad-accum '{acc_steps}' --bug step-condition

total=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ "$failed" -eq 0 ]; then
  echo "check-torch25: all 5 cases as expected (${total}s)"
else
  echo "check-torch25: FAILED (${total}s)"
fi
exit "$failed"
