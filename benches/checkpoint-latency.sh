#!/usr/bin/env bash
# Send latency while checkpoints run: two node binaries alternated, each
# on a fresh data directory with frequent checkpoints (every 4 MiB of
# journal or every second), W1 pipelined sends to many groups, `fsync
# always`. Prints per run the W1 latency figures and the node's STATS
# (checkpoints, commit rounds, fsyncs) read before it stops.
#
# usage: benches/checkpoint-latency.sh OLD_BIN NEW_BIN [PAIRS] [GROUPS] [MESSAGES]
#   defaults: 2 pairs, 200,000 groups, 400,000 messages.
# The load tool is NEW_BIN's `bench` for both (the same driver).
#
# Optional, from the moment STATS shows every W1 group created (its sends
# begin), beside the measured W1:
#   SIDE_LOAD=1  promotions and creations during the sends: a second W1 of
#                4,000-byte sends to 256 other groups (100 each, so each
#                passes the 64 KiB small-group threshold and is promoted),
#                and 100,000 group creations (`-w create --members 0`).
#   PERF_DIR=D   `perf record -e sched:sched_switch -e sched:sched_wakeup -g`
#                of the node until W1 ends, into D/<run>.data (read it with
#                `perf sched timehist -i D/<run>.data --state`, or
#                benches/offcpu-spans.py).
#   PERF_ALL=1   with PERF_DIR: record the whole machine (`-a`) instead of the
#                node (`-p PID`), which misses a switch into a node thread
#                from another process's (offcpu-spans.py says what that
#                loses); about 8 MB per second of W1 on this machine.
set -euo pipefail
old=$1
new=$2
pairs=${3:-2}
groups=${4:-200000}
messages=${5:-400000}
work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-latency.XXXXXX")
trap 'rm -rf "$work"' EXIT

# What runs beside the measured W1 once its groups exist (see the top).
beside() {
    local pid=$1 port=$2 tag=$3
    until "$new" stats --addr "127.0.0.1:$port" 2>/dev/null |
        awk -v n="$groups" '$1 == "engine.groups" && $2 >= n { ok = 1 } END { exit !ok }'; do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    local perf_pid="" side=()
    if [[ -n "${PERF_DIR:-}" ]]; then
        local target=(-p "$pid")
        [[ -n "${PERF_ALL:-}" ]] && target=(-a)
        perf record -e sched:sched_switch -e sched:sched_wakeup -g "${target[@]}" \
            -o "$PERF_DIR/$tag.data" >/dev/null 2>&1 &
        perf_pid=$!
    fi
    if [[ -n "${SIDE_LOAD:-}" ]]; then
        "$new" bench -w w1 --addr "127.0.0.1:$port" --groups 256 --size 4000 \
            --messages 25600 -c 1 --in-flight 4 --id-base 1000000000 --json --quiet \
            >"$work/$tag.promote.json" 2>&1 &
        side+=($!)
        "$new" bench -w create --addr "127.0.0.1:$port" --groups 100000 --members 0 \
            -c 2 --in-flight 16 --id-base 2000000000 --json --quiet \
            >"$work/$tag.create.json" 2>&1 &
        side+=($!)
    fi
    # Until the measured W1 ends (its STATS are read after it).
    while kill -0 "$pid" 2>/dev/null && pgrep -f -- "--addr 127.0.0.1:$port --groups $groups " >/dev/null; do
        sleep 0.2
    done
    for p in "${side[@]}"; do wait "$p" || echo "$tag: a side load failed: $(tail -c 300 "$work/$tag".*.json)"; done
    if [[ -n "$perf_pid" ]]; then
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" || true
    fi
}

run() {
    local bin=$1 tag=$2
    local data="$work/$tag" port=$((20000 + RANDOM % 20000))
    mkdir -p "$data"
    "$bin" serve --data "$data" --listen "127.0.0.1:$port" --fsync always \
        --checkpoint-journal-bytes 4194304 --checkpoint-interval-ms 1000 \
        --log-level warn >"$work/$tag.log" 2>&1 &
    local pid=$!
    "$new" ping --addr "127.0.0.1:$port" >/dev/null 2>&1 || sleep 1
    local load_before
    load_before=$(cut -d' ' -f1 /proc/loadavg)
    if [[ -n "${SIDE_LOAD:-}" || -n "${PERF_DIR:-}" ]]; then
        beside "$pid" "$port" "$tag" &
    fi
    local beside_pid=$!
    "$new" bench -w w1 --addr "127.0.0.1:$port" --groups "$groups" \
        --messages "$messages" -c 8 --in-flight 16 --id-base 0 --json --quiet \
        >"$work/$tag.json"
    local load_after
    load_after=$(cut -d' ' -f1 /proc/loadavg)
    if [[ -n "${SIDE_LOAD:-}" || -n "${PERF_DIR:-}" ]]; then
        wait "$beside_pid" || true
    fi
    "$new" stats --addr "127.0.0.1:$port" >"$work/$tag.stats"
    kill -TERM "$pid"
    wait "$pid" || true
    rm -rf "$data"
    python3 - "$work/$tag.json" "$work/$tag.stats" "$tag" "$load_before" "$load_after" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
stats = {}
for line in open(sys.argv[2]):
    p = line.split()
    if len(p) >= 2 and p[1].isdigit():
        stats[p[0]] = int(p[1])
l = j["latency_us"]
print(f"{sys.argv[3]:8} sends/s {j['ops_per_sec']:9,.0f}  p50 {l['p50']/1000:6.1f} ms  "
      f"p99 {l['p99']/1000:6.1f}  p999 {l['p999']/1000:6.1f}  max {l['max']/1000:6.1f}  "
      f"checkpoints {stats.get('engine.checkpoints', -1)}  rounds {stats.get('engine.commit_rounds', -1)}  "
      f"fsyncs {stats.get('engine.fsyncs', -1)}  load {sys.argv[4]}-{sys.argv[5]}  "
      f"verified {j['verified']}")
EOF
}

for i in $(seq 1 "$pairs"); do
    run "$old" "old-$i"
    run "$new" "new-$i"
done
