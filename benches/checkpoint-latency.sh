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
set -euo pipefail
old=$1
new=$2
pairs=${3:-2}
groups=${4:-200000}
messages=${5:-400000}
work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-latency.XXXXXX")
trap 'rm -rf "$work"' EXIT

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
    "$new" bench -w w1 --addr "127.0.0.1:$port" --groups "$groups" \
        --messages "$messages" -c 8 --in-flight 16 --id-base 0 --json --quiet \
        >"$work/$tag.json"
    local load_after
    load_after=$(cut -d' ' -f1 /proc/loadavg)
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
