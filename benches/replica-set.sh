#!/bin/bash
# W1 against a single node and against the leader of a 3-node replica set
# on this machine (format-spec/cluster.md), alternated ROUNDS times; every
# node with the default fsync=always. Prints one line per run: the setup
# and the load tool's JSON summary (ops_per_sec, latency_us).
#   cargo build --release -p tidemark-server
#   bash benches/replica-set.sh target/release/tidemark [ROUNDS] [MESSAGES]
# The three nodes share the machine's cores with each other and with the
# load tool: compare the ratio, not the absolute figures.
set -euo pipefail
BIN=$1
ROUNDS=${2:-2}
MESSAGES=${3:-200000}
WORK=$(mktemp -d)
pids=""
trap 'kill $pids 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

w1() {
    "$BIN" bench -w w1 --addr "$1" --messages "$MESSAGES" --duration 20 --json --quiet
}

single() {
    rm -rf "$WORK/s"
    "$BIN" serve --data "$WORK/s" --listen 127.0.0.1:7201 >"$WORK/s.log" 2>&1 &
    pids=$!
    sleep 1
    w1 127.0.0.1:7201
    kill $pids; wait $pids 2>/dev/null || true; pids=""
}

replica_set() {
    for i in 1 2 3; do
        peers=""
        for j in 1 2 3; do
            [ "$i" != "$j" ] && peers="$peers --cluster-peer $j=127.0.0.1:731$j,127.0.0.1:730$j"
        done
        rm -rf "$WORK/c$i"
        # shellcheck disable=SC2086
        "$BIN" serve --data "$WORK/c$i" --listen "127.0.0.1:730$i" --cluster-node-id "$i" \
            --cluster-listen "127.0.0.1:731$i" $peers >"$WORK/c$i.log" 2>&1 &
        pids="$pids $!"
    done
    sleep 2
    leader=$("$BIN" cluster status --addr 127.0.0.1:7301 --json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["leader_id"])')
    w1 "127.0.0.1:730$leader"
    kill $pids; wait 2>/dev/null || true; pids=""
}

for round in $(seq "$ROUNDS"); do
    echo "single node, round $round: $(single)"
    echo "replica set of 3, round $round: $(replica_set)"
done
