#!/bin/bash
# Snapshot transfer rate (format-spec/cluster.md section 8): a replica set
# of three on this machine whose third member was never started; the
# other two (a majority) take W1 sends until the leader's engine holds
# about SIZE_MB, with a 4 MiB Raft log bound, so the log no longer holds
# index 1. Then the third member starts with an empty directory: it is
# sent a snapshot of the leader's engine, installs it (restarting itself)
# and follows. Prints per size: the leader's engine bytes, the bytes
# streamed, the receiver's time from Begin to the files durable (its
# log's "received and synced" line) and that rate, and the time from the
# third member's start to the install finished at its restart.
#   cargo build --release -p tidemark-server
#   bash benches/snapshot-transfer.sh target/release/tidemark [SIZE_MB ...]
# Every process shares the machine's cores and disk: compare sizes, and
# read the rate as this machine's.
set -euo pipefail
BIN=$1
shift
SIZES=${*:-64 256}
WORK=$(mktemp -d)
pids=""
trap 'kill $pids 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

# The set's shared secret (format-spec/cluster.md section 7.1).
head -c 32 /dev/urandom | base64 >"$WORK/cluster-token"
chmod 600 "$WORK/cluster-token"

declare -A pid
start() { # id
    local i=$1 peers=""
    for j in 1 2 3; do
        [ "$i" != "$j" ] && peers="$peers --cluster-peer $j=127.0.0.1:741$j,127.0.0.1:740$j"
    done
    # shellcheck disable=SC2086
    RUST_LOG=info "$BIN" serve --data "$WORK/n$i" --listen "127.0.0.1:740$i" \
        --cluster-node-id "$i" --cluster-listen "127.0.0.1:741$i" \
        --cluster-token-file "$WORK/cluster-token" --raft-log-max-bytes 4194304 $peers >/dev/null 2>>"$WORK/n$i.log" &
    pid[$i]=$!
    pids="$pids $!"
}

# A member whose replica stopped (leadership lost under a starved CPU:
# cluster.md section 5.1) is started again, as a supervisor would.
revive() {
    for i in 1 2; do
        kill -0 "${pid[$i]}" 2>/dev/null || start "$i"
    done
}

leader() {
    for i in 1 2; do
        "$BIN" cluster status --addr "127.0.0.1:740$i" --json 2>/dev/null |
            python3 -c 'import json, sys; l = json.load(sys.stdin)["leader_id"]; print(l) if l else sys.exit(1)' &&
            return
    done
    return 1
}

for size in $SIZES; do
    rm -rf "$WORK"/n* && pids=""
    start 1
    start 2
    # W1 with 1000-byte payloads in steps of 16 MB until the leader's
    # engine holds SIZE_MB; a step that fails (an election under way) is
    # just followed by the next.
    while true; do
        sleep 1
        revive
        leader=$(leader) || continue
        engine=$(du -sb "$WORK/n$leader/engine" | cut -f1)
        [ "$engine" -ge $((size * 1000000)) ] && break
        "$BIN" bench -w w1 --addr "127.0.0.1:740$leader" --size 1000 --groups 1000 \
            --messages 16000 --duration 600 --json --quiet >/dev/null 2>&1 || true
    done
    t0=$(date +%s.%N)
    start 3
    until grep -q "finishing the install" "$WORK/n3.log" 2>/dev/null; do sleep 0.01; done
    t1=$(date +%s.%N)
    line=$(grep "received and synced" "$WORK/n3.log" | tail -1)
    python3 - "$size" "$engine" "$t0" "$t1" "$line" <<'PY'
import re, sys
size, engine, t0, t1, line = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
m = re.search(r"(\d+) files, (\d+) bytes received and synced in ([\d.]+) ms \(([\d.]+) MB/s\)", line)
files, streamed, ms, rate = int(m[1]), int(m[2]), float(m[3]), float(m[4])
print(f"W1 {size} MB: leader engine {engine / 1e6:.1f} MB; snapshot {files} files, "
      f"{streamed / 1e6:.1f} MB received and synced in {ms:.0f} ms = {rate:.1f} MB/s; "
      f"new member's start to install finished {float(t1) - float(t0):.2f} s")
PY
    kill $pids 2>/dev/null || true; wait 2>/dev/null || true; pids=""
done
