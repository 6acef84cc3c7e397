#!/usr/bin/env bash
# ddp-verify across two hosts, on one machine: each "host" is a network namespace with a
# hostname of its own (a UTS namespace), the two joined by a veth pair. Open MPI's own
# launcher starts the ranks across them (mpirun --host, its daemon on the second host
# started by netns-agent.sh instead of ssh) and the ranks talk over TCP on the veth only.
# Each case runs twice, on one host (ddp-verify starting its own ranks) and on the two,
# and must give exit 0, the same verdict line and byte-identical --save-trace files.
#
#   tests/hosts/two_hosts.sh [--bin PATH] [--out DIR] [--check] [CASE...]
#
#   --bin PATH  the ddp-verify to run (default: target/release/ddp-verify, else target/debug)
#   --out DIR   keep each case's runs in DIR/CASE/{one,two}/ (stdout, stderr, rc, trace/)
#   --check     only check that this machine can run it (exit 0, or 77 with the reason)
#   CASE        any of: linear-w2 linear-w4 resnet-tiny-w4 tiny-lm-w4 (default: all)
#
# Exit 0: every case agreed; 1: a case did not; 2: bad usage; 77: cannot run here (not
# root, no `ip netns`, no unshare or mpirun), with one line saying why. Needs root. Every
# namespace, interface and file it makes is named after its PID and removed on exit,
# also on failure or Ctrl-C; namespaces left by a run that was killed are removed first.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
agent=$here/netns-agent.sh

declare -A FLAGS=(
    [linear-w2]="--acc-steps 4 --gpus 2 --data-size 16"
    [linear-w4]="--acc-steps 4 --gpus 4 --data-size 16"
    [resnet-tiny-w4]="--model resnet-tiny --acc-steps 4 --gpus 4"
    [tiny-lm-w4]="--model tiny-lm --acc-steps 4 --gpus 4"
)
ALL=(linear-w2 linear-w4 resnet-tiny-w4 tiny-lm-w4)
# The two hosts' addresses; the subnet exists only inside the two namespaces.
SUBNET=10.77.0.0/24
ADDR_A=10.77.0.1
ADDR_B=10.77.0.2

bin="" out="" check=0 cases=()
while [ $# -gt 0 ]; do
    case $1 in
        --bin) bin=${2:?--bin needs a path}; shift 2 ;;
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        --check) check=1; shift ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "two_hosts: unknown option $1" >&2; exit 2 ;;
        *) [ -n "${FLAGS[$1]:-}" ] || { echo "two_hosts: unknown case $1 (${ALL[*]})" >&2; exit 2; }
           cases+=("$1"); shift ;;
    esac
done
[ ${#cases[@]} -gt 0 ] || cases=("${ALL[@]}")

skip() {
    echo "two_hosts: skipped: $*"
    exit 77
}

# What it needs, each missing piece named.
[ "$(id -u)" = 0 ] || skip "not root (ip netns and unshare need root)"
for tool in ip unshare hostname mpirun timeout cmp awk; do
    command -v "$tool" >/dev/null || skip "$tool is not installed"
done
ip netns list >/dev/null 2>&1 || skip "ip netns is unavailable ($(ip netns list 2>&1 | head -1))"

A=ddpv-$$-a
B=ddpv-$$-b
work="" child=""

# Runs a command in the background and waits for it, so a signal to this script is
# handled at once (bash runs traps only between foreground commands).
run() {
    local rc
    "$@" &
    child=$!
    wait "$child"
    rc=$?
    child=""
    return $rc
}

cleanup() {
    local ns pid
    trap - EXIT INT TERM
    # The run in progress; ddp-verify and timeout pass the signal on to their ranks.
    [ -z "$child" ] || { kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; }
    for ns in "$A" "$B"; do
        [ -e "/var/run/netns/$ns" ] || continue
        # Everything still inside is this run's (mpirun, orted, ranks): stop it first.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null # the veth pair goes with it
    done
    [ -z "$work" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# What an earlier run left when it was killed before its own cleanup (its PID is gone).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^ddpv-[0-9]+-[ab]$'); do
    pid=${ns#ddpv-}
    pid=${pid%-*}
    kill -0 "$pid" 2>/dev/null || ip netns del "$ns" 2>/dev/null
done
for dir in "${TMPDIR:-/tmp}"/ddpv-hosts-*; do
    pid=${dir##*/ddpv-hosts-}
    pid=${pid%%.*}
    [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null && rm -rf "$dir"
done

ip netns add "$A" 2>/dev/null || skip "cannot create a network namespace (ip netns add: $(ip netns add "$A" 2>&1))"
ip netns add "$B" || exit 1
ip netns exec "$A" unshare --uts true 2>/dev/null || skip "unshare --uts fails inside a network namespace"
[ "$check" = 0 ] || { echo "two_hosts: this machine can run it"; exit 0; }

if [ -z "$bin" ]; then
    bin=$repo/target/release/ddp-verify
    [ -x "$bin" ] || bin=$repo/target/debug/ddp-verify
fi
[ -x "$bin" ] || { echo "two_hosts: no ddp-verify at $bin (cargo build --release, or --bin PATH)" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

work=$(mktemp -d "${TMPDIR:-/tmp}/ddpv-hosts-$$.XXXXXX")
kept="rerun with --out DIR to keep the runs"
[ -n "$out" ] || out=$work/out
mkdir -p "$out" "$work/tmp" || exit 1
out=$(cd "$out" && pwd)
[[ $out == "$work"/* ]] || kept="runs kept in $out"

# Host A and host B, joined by a veth pair; each with its loopback up.
ip -n "$A" link add veth-a type veth peer name veth-b netns "$B" || exit 1
ip -n "$A" addr add "$ADDR_A/24" dev veth-a
ip -n "$B" addr add "$ADDR_B/24" dev veth-b
for ns in "$A" "$B"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "veth-${ns##*-}" up
done
if command -v ping >/dev/null && ! ip netns exec "$A" ping -c 1 -W 2 "$ADDR_B" >/dev/null 2>&1; then
    echo "two_hosts: host A cannot reach host B over the veth" >&2
    exit 1
fi

tx_bytes() { ip netns exec "$A" cat /sys/class/net/veth-a/statistics/tx_bytes; }

seconds() { date +%s.%N; }

# The last line that starts a verdict: EQUIVALENT / NOT EQUIVALENT / ...
verdict() { grep -E '^[A-Z][A-Z ]+:' "$1" | tail -1; }

failed=0
echo "two_hosts: hosts $A ($ADDR_A) and $B ($ADDR_B), binary $bin"
for case in "${cases[@]}"; do
    read -r -a flags <<<"${FLAGS[$case]} --device cpu"
    w=$(awk '{for (i = 1; i < NF; i++) if ($i == "--gpus") print $(i + 1)}' <<<"${FLAGS[$case]}")
    dir=$out/$case
    rm -rf "$dir"
    mkdir -p "$dir/one" "$dir/two"

    # One host: ddp-verify starts its own W ranks.
    t0=$(seconds)
    run "$bin" "${flags[@]}" --save-trace "$dir/one/trace" </dev/null >"$dir/one/stdout" 2>"$dir/one/stderr"
    echo $? >"$dir/one/rc"
    t1=$(seconds)

    # Two hosts: W/2 ranks on each, started by Open MPI's launcher from host A.
    cmd=(mpirun --allow-run-as-root -np "$w" --host "$A:$((w / 2)),$B:$((w / 2))"
        --mca plm_rsh_agent "$agent"
        --mca pml ob1 --mca btl tcp,self
        --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET"
        --mca orte_tmpdir_base "$work/tmp" --bind-to none --display-map
        "$bin" "${flags[@]}" --save-trace "$dir/two/trace")
    echo "${cmd[*]}" >"$dir/two/command"
    tx0=$(tx_bytes)
    run timeout -k 5 120 ip netns exec "$A" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$A" "${cmd[@]}" \
        </dev/null >"$dir/two/stdout" 2>"$dir/two/stderr"
    echo $? >"$dir/two/rc"
    tx=$(($(tx_bytes) - tx0))
    t2=$(seconds)

    problems=()
    [ "$(cat "$dir/one/rc")" = 0 ] || problems+=("one host: exit $(cat "$dir/one/rc")")
    [ "$(cat "$dir/two/rc")" = 0 ] || problems+=("two hosts: exit $(cat "$dir/two/rc")")
    # mpirun --display-map: the ranks really ran on both hosts.
    for host in "$A" "$B"; do
        grep -q "Data for node: $host" "$dir/two/stdout" "$dir/two/stderr" || problems+=("no rank ran on $host")
    done
    [ "$tx" -gt 0 ] || problems+=("nothing went over the veth")
    # The report proper, without Open MPI's job map before it.
    sed -n '/^ddp-verify: /,$p' "$dir/two/stdout" >"$dir/two/report"
    if cmp -s "$dir/one/stdout" "$dir/two/report"; then report="same report"; else report="reports differ"; fi
    v1=$(verdict "$dir/one/stdout")
    v2=$(verdict "$dir/two/stdout")
    [ -n "$v1" ] && [ "$v1" = "$v2" ] || problems+=("verdicts differ: one host '$v1', two hosts '$v2'")
    for f in accumulation.safetensors ddp.safetensors report.json; do
        cmp -s "$dir/one/trace/$f" "$dir/two/trace/$f" || problems+=("$f differs")
    done

    timing=$(awk -v a="$t0" -v b="$t1" -v c="$t2" -v tx="$tx" \
        'BEGIN { printf "one host %.1f s, two hosts %.1f s, %d bytes over the veth", b - a, c - b, tx }')
    if [ ${#problems[@]} = 0 ]; then
        echo "two_hosts: $case (W=$w): same verdict, bit-identical traces, $report ($timing): ${v1%%:*}"
    else
        failed=1
        echo "two_hosts: $case (W=$w): FAILED ($timing)"
        printf '  %s\n' "${problems[@]}"
        echo "  --- one host: stderr (last lines)"
        tail -n 15 "$dir/one/stderr" | sed 's/^/    /'
        echo "  --- two hosts: stderr (last lines)"
        tail -n 15 "$dir/two/stderr" | sed 's/^/    /'
        echo "  --- $report; $kept"
        echo "  --- command: $(cat "$dir/two/command")"
    fi
done
exit $failed
